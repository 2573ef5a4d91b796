"""The QLoRA demo's parts: the synthetic task, the model, the device it runs on, and the report.
``examples/demo.py`` runs them."""
