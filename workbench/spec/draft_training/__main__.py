"""``python -m workbench.spec.draft_training``: train the draft (see ``train.py`` for the options)."""

from workbench.spec.draft_training.train import main

main()
