"""``python -m workbench.draft_training``: train the draft (see ``train.py`` for the options)."""

from workbench.draft_training.train import main

if __name__ == "__main__":  # importing this module (the import-cycle test walks every module) must not train
    main()
