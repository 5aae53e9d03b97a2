"""The notebooks' toolkit: widgets and plotly figures over the engine's measurements, one module per chapter.

Only this package imports ipywidgets and plotly; the engine never imports it, so ``workbench`` stays usable
without a notebook stack. Each notebook starts with ``setup_notebook()``, which pins the plotly renderer.
"""

from workbench.lab.common import measured_on, notebook_device, setup_notebook

__all__ = ["measured_on", "notebook_device", "setup_notebook"]
