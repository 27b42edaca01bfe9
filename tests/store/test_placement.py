"""Where the caches go (store.placement): the volume, local disk, the tiers, from plain values."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmstart.settings import from_env
from warmstart.store.placement import place_caches, place_volume, probe_volume

KEY = "m--abc"
VOL = Path("/vol")
LOCAL = Path("/local")


def settings(**env: str):
    return from_env({"MODEL_NAME": "org/m", "RUNPOD_VOLUME_PATH": str(VOL), "WARMSTART_LOCAL_CACHE": str(LOCAL), **env})


def test_a_writable_volume_holds_everything_in_direct_mode():
    s = settings(WARMSTART_CACHE_MODE="direct")
    volume = place_volume(s, mounted=True, not_writable=None)
    assert (volume.layout.root, volume.layout.on_volume, volume.read_only, volume.warnings) == (VOL, True, None, ())
    place = place_caches(s, volume, KEY)
    assert place.cache_dirs.base == VOL / "warmstart" / "keys" / KEY / "cache"
    assert (place.staged_root, place.open_s3, place.publish_blocked, place.warnings) == (None, False, None, ())


def test_staged_mode_caches_locally_and_stages_on_the_volume():
    s = settings(WARMSTART_CACHE_MODE="staged")
    place = place_caches(s, place_volume(s, mounted=True, not_writable=None), KEY)
    assert place.cache_dirs.base == LOCAL / "warmstart" / "keys" / KEY / "cache"
    assert place.staged_root == VOL / "warmstart" / "keys" / KEY / "staged"
    assert not place.open_s3 and place.publish_blocked is None


def test_no_volume_keeps_caches_local_and_says_so():
    s = settings(WARMSTART_CACHE_MODE="staged")
    volume = place_volume(s, mounted=False, not_writable=None)
    assert volume.layout.root == LOCAL and not volume.layout.on_volume
    assert volume.warnings == (f"no volume at {VOL}: caches go to {LOCAL} and will not outlive this worker",)
    place = place_caches(s, volume, KEY)
    assert place.staged_root is None and not place.open_s3
    assert place.warnings == ("WARMSTART_CACHE_MODE=staged needs a volume or WARMSTART_S3_URL: caches stay local",)


@pytest.mark.parametrize("has_generations", [True, False])
def test_a_read_only_volume_is_read_from_but_never_published_to(has_generations):
    s = settings(WARMSTART_CACHE_MODE="staged")
    volume = place_volume(s, mounted=True, not_writable="/vol/warmstart: Read-only file system")
    assert volume.layout.root == LOCAL and volume.read_only is not None and volume.read_only.root == VOL
    assert volume.read_only_hubs == (VOL / "huggingface-cache" / "hub",)
    assert "is not writable (/vol/warmstart: Read-only file system)" in volume.warnings[0]
    assert "S3" not in volume.warnings[0]
    place = place_caches(s, volume, KEY, has_generations=lambda root: has_generations)
    assert place.cache_dirs.base == LOCAL / "warmstart" / "keys" / KEY / "cache"
    assert place.staged_root == (VOL / "warmstart" / "keys" / KEY / "staged" if has_generations else None)
    assert place.publish_blocked == f"the volume {VOL} is not writable"


def test_s3_is_a_tier_in_staged_mode_only():
    staged = settings(WARMSTART_CACHE_MODE="staged", WARMSTART_S3_URL="s3://bucket/prefix")
    place = place_caches(staged, place_volume(staged, mounted=False, not_writable=None), KEY)
    assert place.open_s3 and place.warnings == ()
    assert place.cache_dirs.base == LOCAL / "warmstart" / "keys" / KEY / "cache"
    read_only = place_volume(staged, mounted=True, not_writable="read-only")
    assert read_only.warnings[0].endswith("nothing will be published to it (the S3 store still is)")

    direct = settings(WARMSTART_CACHE_MODE="direct", WARMSTART_S3_URL="s3://bucket/prefix")
    place = place_caches(direct, place_volume(direct, mounted=True, not_writable=None), KEY)
    assert not place.open_s3
    assert place.warnings == ("WARMSTART_S3_URL is used in staged mode only (WARMSTART_CACHE_MODE=direct): no S3 tier",)


def test_probe_volume_tries_the_real_directories(tmp_path):
    s = from_env(
        {
            "MODEL_NAME": "org/m",
            "RUNPOD_VOLUME_PATH": str(tmp_path / "vol"),
            "WARMSTART_LOCAL_CACHE": str(tmp_path / "local"),
        }
    )
    assert not probe_volume(s).layout.on_volume
    (tmp_path / "vol").mkdir()
    volume = probe_volume(s)
    assert volume.layout.on_volume and volume.read_only is None
