"""What every chapter of the lab uses, one owner for each piece, none of it tied to a chapter.

- `notebook`: the plotly renderer pin, the device a notebook measures on, and the "measured on …" label;
- `figures`: figure styling, and reading or changing a trace **by its name** (never by position);
- `panel`: the panel base: controls, a progress line, a status line, stored figures and a result object,
  measured when asked (``.run()`` or first display), never when constructed;
- `progress`: the progress callback type the measurements take, and its widget (lit at once, with a clock);
- `threads`: torch's thread count for a measurement, from what the rest of the machine leaves free;
- `contention`: whether the machine was busy while a panel measured, for status lines and verdicts;
- `memory`: what the chapter's kernel holds, and how to free it before the next chapter;
- `stored`: static copies of figures and tables as notebook outputs (plotly JSON, HTML, PNG);
- `exercises`: "Try this" questions whose answers the package computes;
- `closing`: the closing table of a chapter, one vocabulary of verdicts, each computed from results;
- `lazy`: how a chapter package names what it exports without importing its widgets up front.

Timing of device work is `workbench.timing` (shared with `workbench.roofline`). This ``__init__`` imports
nothing, so a chapter's ``runs`` module can use the kit without loading ipywidgets or plotly.
"""
