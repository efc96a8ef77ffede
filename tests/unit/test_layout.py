"""The actor layout when ``execution.num_workers`` / ``threads_per_worker`` are ``auto``."""

from types import SimpleNamespace

from pipelines.workers.layout import COMPILE_FROM_ENTITIES, Machine, compile_model, job_layout, plan_layout


def test_cpu_one_actor_per_node_with_all_its_cores():
    assert plan_layout(Machine((2,), (0.0,)), "auto", "auto", 0)[:2] == (1, 2)
    assert plan_layout(Machine((16, 8), (0.0, 0.0)), "auto", "auto", 0)[:2] == (2, 8)  # the smallest node fits


def test_gpu_one_actor_per_share_and_cpus_split_between_them():
    assert plan_layout(Machine((16,), (2.0,)), "auto", "auto", 1)[:2] == (2, 8)
    assert plan_layout(Machine((16, 16), (1.0, 1.0)), "auto", "auto", 0.5)[:2] == (4, 8)


def test_a_configured_number_is_kept_and_fills_the_other():
    assert plan_layout(Machine((8,), (0.0,)), 4, "auto", 0)[:2] == (4, 2)
    assert plan_layout(Machine((2,), (0.0,)), "auto", 1, 0)[:2] == (2, 1)
    assert plan_layout(Machine((2,), (0.0,)), 3, 5, 0)[:2] == (3, 5)


def test_job_layout_reads_this_machine():
    ex = SimpleNamespace(num_workers="auto", threads_per_worker="auto", gpus_per_worker=0.0, address=None)
    local = Machine.local()
    assert job_layout(ex)[:2] == (1, local.cpus[0])


def test_compile_auto_follows_the_run_size_and_a_setting_wins():
    auto, on, off = (SimpleNamespace(compile=c) for c in ("auto", True, False))
    assert not compile_model(auto, COMPILE_FROM_ENTITIES - 1) and compile_model(auto, COMPILE_FROM_ENTITIES)
    assert compile_model(auto, None)  # size unknown (incremental runs): compile
    assert compile_model(on, 1) and not compile_model(off, 10_000)
