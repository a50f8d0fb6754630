"""The loop the simulator stands in for: the real engine reports each step's executor time to
the scheduler, and the slo policy's model learns from it; `cadence sim` is a subcommand."""

from __future__ import annotations

import time

from cadence.cli import main as cadence_main
from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.sampling_params import SamplingParams
from cadence.core.scheduler import Scheduler
from cadence.engine.llm_engine import LLMEngine
from cadence.executor.fake_executor import FakeExecutor


class SlowFake(FakeExecutor):
    """A FakeExecutor that takes a measurable time per token."""

    def execute(self, plan):
        time.sleep(0.0005 + 0.00002 * plan.num_tokens)
        return super().execute(plan)


def test_engine_reports_executor_time_to_the_slo_policy():
    scheduler = Scheduler(
        SchedulerConfig(policy="slo", target_itl_ms=50.0), CacheConfig(num_blocks=256)
    )
    engine = LLMEngine.from_parts(scheduler, SlowFake(64))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.add_request("a", list(range(3, 40)), params)
    engine.add_request("b", list(range(5, 90)), params)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    model = scheduler.policy.cost_model
    assert model.num_observations == steps
    # It learned from measured times (which never equal the prior's guesses exactly); no
    # assertion on their values: timings are noisy.
    assert model.coefficients != model.config.prior


def test_cadence_sim_is_a_subcommand(capsys):
    argv = ["sim", "--streams", "1", "--stream-output", "20", "--doc-tokens", "64",
            "--doc-arrival", "0.05", "--budgets", "32", "--targets", "40"]
    assert cadence_main(argv) == 0
    assert "slo 40 ms" in capsys.readouterr().out
