"""The QLoRA demo's parts: the synthetic task, the model, and the report. ``examples/demo.py`` runs them."""
