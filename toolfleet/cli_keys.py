"""``toolfleet keygen``: a new fleet key (docs/signing.md)."""

from __future__ import annotations

import sys

from .cli import app
from .signing import generate_key, key_id


@app.command()
def keygen() -> None:
    """Print a new random fleet key (32 bytes, URL-safe base64) on stdout and its key id on stderr.
    Put it in TOOLFLEET_FLEET_KEY or a key file (TOOLFLEET_FLEET_KEY_FILE) of every dispatcher and worker."""
    key = generate_key()
    sys.stdout.write(key + "\n")
    sys.stderr.write(f"key id {key_id(key)}\n")
