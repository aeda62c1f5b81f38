"""The warm pools of the differential tests: one directory per test module."""

import os

import pytest

from phalanx.launch import warm

from ..conftest import stop_pools


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pools")
    os.chmod(directory, 0o700)
    yield str(directory)
    stop_pools(warm, str(directory))
