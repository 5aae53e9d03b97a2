"""Chapter 08 of the course: its measurements (runs), panels and ending (exercises, closing table)."""
