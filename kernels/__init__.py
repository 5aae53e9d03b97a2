"""Triton kernels of KV Workbench and their PyTorch references, imported as ``workbench_kernels``.

The folder is named ``kernels/`` but installed under another import name because ``kernels`` is Hugging
Face's kernel-hub package, which transformers looks up by name; this module is kept free of imports so that
even a lookup that finds the folder by its directory name costs nothing and changes nothing.
"""
