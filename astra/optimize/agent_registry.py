"""Which agent drives a run, and how each is built: a small registry of agent factories.

`agent_kind(opts)` is the one rule choosing the agent (the run records it as its `agent`); `make_agent`
looks up the factory registered for that kind's prefix and returns the agent complete: everything it
needs (the evaluator, its LLM client with what a resumed run already spent, the search log) is passed to
its constructor, nothing is set on it afterwards. The built-in agents register through the same
`register` hook any other agent would:

    @register("offline")
    def _offline(setup: AgentSetup) -> Agent: ...

Factories import their agent when called, so choosing one never loads another's dependencies (openai).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import Agent
from astra.optimize.options import OptimizeOptions
from astra.optimize.rundir import RunDir
from astra.sglang.tree import SglangTree
from astra.spec.model import KernelSpec

Printer = Callable[[str], None]


@dataclass
class AgentSetup:
    """What an agent may be built from."""

    spec: KernelSpec
    tree: SglangTree
    run: RunDir
    evaluator: Evaluator  # the judge the loop uses: agents screen with it or extend its suite
    opts: OptimizeOptions
    say: Printer = print


AgentFactory = Callable[[AgentSetup], Agent]
_FACTORIES: dict[str, AgentFactory] = {}


def register(kind: str) -> Callable[[AgentFactory], AgentFactory]:
    """A decorator: `factory` builds the agents whose kind is `kind` or starts with `kind:`."""

    def add(factory: AgentFactory) -> AgentFactory:
        _FACTORIES[kind] = factory
        return factory

    return add


def llm_config(opts: OptimizeOptions):
    """The LLM settings from flags > $ASTRA_HOME/config.yaml > environment (astra.llm.client)."""
    from astra.llm.client import resolve_config

    flags = {"base_url": opts.base_url, "model": opts.model, "budget_tokens": opts.budget_tokens,
             "budget_usd": opts.budget_usd}
    return resolve_config({k: v for k, v in flags.items() if v is not None})


def agent_kind(opts: OptimizeOptions) -> str:
    """The one rule choosing the agent: `--offline` forces the search agent; otherwise a model named by
    a flag, the config file or $ASTRA_MODEL selects the LLM agent; with none, the search agent. `--agent
    exec:CMD` (which refuses --offline and --model) runs a command as the agent."""
    if opts.agent:
        return opts.agent.strip()
    if opts.offline:
        return "offline"
    cfg = llm_config(opts)
    return f"llm:{cfg.model}" if cfg.model else "offline"


def make_agent(setup: AgentSetup) -> Agent:
    """The agent `agent_kind` chooses for these options, built by its registered factory."""
    kind = agent_kind(setup.opts)
    return _FACTORIES[kind.split(":", 1)[0]](setup)


@register("offline")
def _offline(setup: AgentSetup) -> Agent:
    from astra.optimize.ncu_profile import Profiler
    from astra.optimize.offline import OfflineAgent, search_logger
    from astra.optimize.profiling import ProfilingAgent

    spec, tree, judge = setup.spec, setup.tree, setup.evaluator
    from astra.sglang.clang_env import libclang_missing

    passes_off = libclang_missing()
    if passes_off:
        setup.say(f"warning: the rewrite passes are off, every one refuses without libclang: {passes_off}")
    # Nsight Compute per band where the run has a GPU (the evaluator screens), kept in the run per (source, shape)
    ncu = Profiler(spec, tree, diagnose=True) if judge.screens else None
    profiler = ProfilingAgent(ncu, cache_dir=setup.run.root / "profiles", extra_shapes=lambda: judge.extra_shapes)
    return OfflineAgent(spec.kernel_file, tree.csrc_dir, [str(tree.include_dir)], evaluator=judge,
                        entries=[w["entry"] for w in spec.raw["build"].get("wrappers", []) if "entry" in w],
                        on_search_line=search_logger(setup.run, setup.say), profiler=profiler, spec=spec.raw)


@register("llm")
def _llm(setup: AgentSetup) -> Agent:
    from astra.llm.client import Client
    from astra.optimize.llm_agent import LLMAgent

    client = Client(llm_config(setup.opts), transcript=setup.run.transcript)
    spent = setup.run.state()
    client.carry(spent.tokens, spent.cost_usd)  # its budgets count what the run spent before a resume
    return LLMAgent(client, setup.spec, setup.tree, evaluator=setup.evaluator, samples=setup.opts.samples)


@register("exec")
def _exec(setup: AgentSetup) -> Agent:
    from astra.optimize.exec_agent import ExecAgent, exec_command

    return ExecAgent(exec_command(setup.opts.agent), setup.spec, setup.opts.agent_timeout_s, tree=setup.tree)
