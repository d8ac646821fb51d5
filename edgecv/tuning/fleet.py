"""Placeholder, replaced below."""


def add_server_parser(sub, common) -> None:
    pass
