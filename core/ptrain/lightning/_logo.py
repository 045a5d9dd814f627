"""The banner a Lightning program's ``cli_lightning_logo()`` prints: ptrain's own."""

LIGHTNING_LOGO = r"""
         _             _
   _ __ | |_ _ __ __ _(_)_ __
  | '_ \| __| '__/ _` | | '_ \
  | |_) | |_| | | (_| | | | | |
  | .__/ \__|_|  \__,_|_|_| |_|
  |_|   (Lightning programs)
"""


def cli_lightning_logo() -> None:
    """Print :data:`LIGHTNING_LOGO` between blank lines, as a Lightning program's start-up
    banner."""
    print()
    print(LIGHTNING_LOGO)
    print()
