"""Backend discovery (placeholder: being written)."""


def load_backends() -> None:
    pass
