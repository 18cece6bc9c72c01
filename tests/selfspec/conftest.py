"""Every test gets its own selfspec cache directory (the verify-cost curves `num_draft_tokens="auto"` keeps), so no
test reads what another run learned and none writes into the user's ~/.cache."""
import pytest

from selfspec.verify_cost import CACHE_DIR_ENV


@pytest.fixture(autouse=True)
def _private_selfspec_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path_factory.mktemp("selfspec-cache")))
