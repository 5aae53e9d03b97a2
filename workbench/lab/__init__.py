"""The notebooks' toolkit: one package per chapter over one shared kit.

    workbench/lab/kit/     what every chapter uses (panel base, figures by trace name, stored outputs,
                           exercises, the closing table, notebook labels)
    workbench/lab/chNN/    one chapter: ``runs`` (measurements, no widgets), ``panels`` (controls and
                           figures), ``ending`` (exercises and the closing table), and its ``__init__``, which
                           names every export beside the module that owns it

A notebook's set-up cell is one import, ``from workbench.lab import ch05``. Only this package imports ipywidgets
and plotly, and only where a panel or figure is built; nothing outside ``workbench.lab`` imports it, so the
engine stays usable without a notebook stack (tests/test_import_cycles.py checks both).
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, NOTEBOOK_NAMES)
