"""What the content package needs of the store, declared here by its consumer.

`Reader` and `Mover` see the environments, the chunk table, the writer, the tiers, the
keyring, the decoder threads and the replica barrier; not the catalog, the id generator,
the clock or the settings. `vault/store.py`'s `Store` has all of these, so it is passed as
is, and this package never imports the store that holds the chunk table it defines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..env import Env
    from ..runtime import Runtime
    from ..seal import Keyring
    from ..tier import Tier
    from ..writer import Writer
    from .chunks import Chunks
    from .shared import SharedIndex


class ContentParts(Protocol):
    @property
    def catalog_env(self) -> Env: ...
    @property
    def frames_env(self) -> Env: ...
    @property
    def chunks(self) -> Chunks: ...
    @property
    def writer(self) -> Writer: ...
    @property
    def tiers(self) -> Mapping[str, Tier]: ...
    @property
    def keyring(self) -> Keyring | None: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def replica_barrier(self) -> Callable[[float], bool] | None: ...
    @property
    def shared(self) -> SharedIndex | None: ...
