"""Where a client finds a server by default, and where `ckpt serve` keeps its data.

Shared so `ckpt serve` (cli) and the server's settings (api/settings.py) agree.
"""

from __future__ import annotations

API_PREFIX = "/v1"
DEFAULT_URL = "http://127.0.0.1:8470"
DEFAULT_PORT = 8470
DEFAULT_DATA_DIR = "ckpt-data"
ADMIN_TOKEN_FILE = "admin.token"
LOCAL_SOCKET_FILE = "ckpt.sock"  # in the data dir: the server's Unix-domain socket
