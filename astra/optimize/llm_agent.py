"""The LLM agent: testing, profiling, planning and coding roles on any OpenAI-compatible endpoint.

The roles are prompt templates (prompts/*.md) and one client; the loop does not know which agent it
drives. Each round reads the loop's `Context` (texts in astra.optimize.llm_context):

- profiling: the best's per-shape table (both floors, x practical per view), the bands, ptxas and an
  Nsight Compute profile of one representative shape (astra.optimize.ncu_profile); its JSON is parsed;
- planning: the original and the best source, the same tables, the parsed profile, the last failures
  with their reasons, the history by idea and the budget left; it answers a JSON plan (band, idea,
  expected speedup, risk) whose band is checked against the verdict's bands and drives the round;
- coding: the plan, the target band's shapes, the best's table and the failures; asked `samples` times
  concurrently, each answer search/replace edits; an edit that does not apply goes back to the model
  with the error written for it (which block, the nearest real lines), up to `edit_attempts` times.

Every distinct applicable answer is a Proposal named `llm:r<round>:<slug of the idea>`, described by the
idea and its target band. The testing role runs once per run and adds shapes to the evaluator's suite
(spec shapes stay): every later verdict judges them too.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from astra.errors import AstraError
from astra.llm import templates
from astra.llm.client import Client, LLMError, LLMNoUsableReply
from astra.optimize import llm_context, ncu_profile
from astra.optimize.edits import apply_reply
from astra.optimize.evaluator import Evaluator
from astra.optimize.llm_context import Plan, json_block
from astra.optimize.loop import Agent, Context, Proposal, source_id
from astra.optimize.rundir import RoundPlan
from astra.text import one_line
from harness import Verdict, policy_text


class LLMAgent(Agent):
    """`client`: the model's endpoint, carrying what a resumed run already spent; `evaluator`: the run's
    judge, whose suite the testing role's shapes extend."""

    def __init__(self, client: Client, spec, tree, *, evaluator: Evaluator, edit_attempts: int = 3, samples: int = 1,
                 profiler=None):
        if samples < 1:
            raise AstraError(f"samples must be at least 1, not {samples}")
        self.client, self.spec, self.tree, self.evaluator = client, spec, tree, evaluator
        self.edit_attempts, self.samples = edit_attempts, samples
        self.name = f"llm:{client.cfg.model}"
        self.rationale = ""
        self.last_plan: Plan | None = None
        # (source, case id, extra shapes) -> its Nsight Compute profile dict (astra.optimize.ncu_profile)
        self.profiler = profiler if profiler is not None else ncu_profile.Profiler(spec, tree)
        self._profiles: dict[tuple[str, str | None], dict] = {}  # ("original" or source_id, case id) -> profile
        self._tested = False

    @property
    def extra_shapes(self) -> list[dict]:
        """The shapes the testing role added to the suite (the evaluator's, which judges them)."""
        return self.evaluator.extra_shapes

    def usage(self) -> tuple[int, float]:
        total = self.client.usage.total()
        return total.tokens, float(total.cost_usd or 0.0)

    def _common(self) -> dict:
        return {"kernel": self.spec.name, "sglang_version": self.tree.version, "kernel_file": self.spec.kernel_file}

    def propose(self, ctx: Context) -> list[Proposal]:
        if not self._tested:
            self._tested = True
            self.evaluator.add_shapes(self.test_shapes(ctx))
        verdict, ideas = ctx.base_verdict, self._ideas(ctx)
        tables = {"gpu": _gpu(verdict), "measurements": llm_context.shape_table(verdict),
                  "bands": llm_context.band_table(verdict), "ncu": self._ncu(ctx)}
        profile = llm_context.parse_profile(self._ask(
            "profiling", environment=_environment(verdict), resources=llm_context.resources_text(verdict),
            source=ctx.base_source, **tables))
        plan = llm_context.parse_plan(self._ask(
            "planning", description=self.spec.raw.get("description", ""), budget=ctx.budget_text(),
            rounds_left=ctx.rounds_left, original_source=ctx.original_source or ctx.base_source,
            best=_best_text(ctx, ideas), source=_best_source(ctx), profile=llm_context.profile_text(profile),
            failures=llm_context.failures_text(ctx.failures), history=llm_context.history_text(ctx.history, ideas),
            band_choices=", ".join(llm_context.bands_present(verdict)), **tables), verdict)
        self.last_plan = plan
        self.plan = RoundPlan(ctx.round, self.name, "original" if ctx.best_n is None else f"best #{ctx.best_n}",
                              plans=[replace(plan, idea=self._safe(plan.idea, 600),
                                             rationale=self._safe(plan.rationale, 600)).to_dict()])
        if plan.stop:
            self.rationale = self._safe(f"the planner stopped: {plan.rationale}", 200)
            return []
        idea = self._safe(plan.idea, 300)
        self.rationale = self._safe("; ".join([idea, *plan.notes]), 200)
        coding = {"plan": llm_context.plan_text(plan), "target_band": plan.band,
                  "band_shapes": llm_context.band_shapes(verdict, plan.band), "measurements": tables["measurements"],
                  "failures": llm_context.failures_text(ctx.failures)}
        sources, notes = [], []
        for source, note in self._samples(ctx.base_source, coding):
            if source is None:
                notes.append(note)
            elif source not in sources:
                sources.append(source)
        if not sources:  # the model answered, and nothing it wrote can be built: not "nothing left to try"
            self.rationale = self._safe(f"{idea}: {notes[0] if notes else 'no candidate'}", 200)
            why = notes[0] if notes else "no candidate"
            raise LLMNoUsableReply(
                f"model '{self.client.cfg.model}' answered, but none of its {self.samples * self.edit_attempts} "
                f"coding replies held an edit of {self.spec.kernel_file} that applies ({why}); its replies are in "
                "the run's transcript.jsonl; try a stronger model, or --samples N")
        name = f"llm:r{ctx.round}:{llm_context.slug(idea)}"
        predicted = f", predicted x{plan.expected_speedup:.2f}" if plan.expected_speedup is not None else ""
        description = f"{idea} (target band: {plan.band}{predicted})"
        return [Proposal(name if len(sources) == 1 else f"{name}:s{k}", "llm", description, self.client.redact(s))
                for k, s in enumerate(sources, 1)]

    def _samples(self, base: str, values: dict) -> list[tuple[str | None, str]]:
        """The coder asked `samples` times at once; a sample that hits an LLM error counts only when every
        sample did (then the first error is raised)."""
        if self.samples == 1:
            return [self._code(base, values)]
        with ThreadPoolExecutor(max_workers=self.samples, thread_name_prefix="astra-coder") as pool:
            futures = [pool.submit(self._code, base, values) for _ in range(self.samples)]
        results, errors = [], []
        for future in futures:
            try:
                results.append(future.result())
            except LLMError as err:
                errors.append(err)
        if errors and not any(source for source, _ in results):
            raise errors[0]
        return results + [(None, f"a sample failed: {err}") for err in errors]

    def _safe(self, text: str, limit: int) -> str:
        """Model text bound for the terminal, the report and meta.json: no key, no control characters."""
        return one_line(self.client.redact(str(text)), limit)

    def _code(self, base: str, values: dict) -> tuple[str | None, str]:
        """(the edited source, "") or (None, why there is none)."""
        exports = [w["export"] + " -> " + w["entry"] for w in self.spec.raw["build"].get("wrappers", [])]
        feedback = "none"
        for _ in range(self.edit_attempts):
            reply = self._ask("coding", exports="\n".join(exports), feedback=feedback, source=base, **values)
            result = apply_reply(base, reply, filename=self.spec.kernel_file)
            if result.ok and result.new_text != base:
                return result.new_text, ""
            feedback = result.feedback() if not result.ok else "Your reply changed nothing; make the planned change."
        return None, f"no applicable edit in {self.edit_attempts} attempts"

    def _ncu(self, ctx: Context) -> str:
        """Nsight Compute on one representative shape: the original, then the best (each profiled once)."""
        case = ncu_profile.pick_case(ctx.base_verdict)
        lines = [ncu_profile.text(self._profile(None, case), "original")]
        if ctx.best_n is None:
            lines.append("best: the original (nothing verified faster yet)")
        else:
            lines.append(ncu_profile.text(self._profile(ctx.base_source, case), f"best (#{ctx.best_n})"))
        return "\n".join(lines)

    def _profile(self, source: str | None, case: str | None) -> dict:
        key = ("original" if source is None else source_id(source), case)
        if key not in self._profiles:
            self._profiles[key] = self.profiler(source, case, self.extra_shapes)
        return self._profiles[key]

    def _ideas(self, ctx: Context) -> dict[int, str]:
        """Candidate number -> its idea (the description in its meta.json), for the history."""
        if not ctx.run_dir:
            return {}
        from astra.optimize.rundir import RunDir

        run, ideas = RunDir(Path(ctx.run_dir)), {}
        for n in {h.n for h in ctx.history[-12:]} | ({ctx.best_n} if ctx.best_n is not None else set()):
            try:
                meta = run.candidate(n)[1]
            except AstraError:  # unreadable: the history shows its name instead
                continue
            if meta.get("description"):
                ideas[n] = one_line(meta["description"], 300)
        return ideas

    def test_shapes(self, ctx: Context) -> list[dict]:
        """Extra shapes from the testing role, kept only where every spec dim is given as an int."""
        dims = list(self.spec.raw["dims"])
        reply = self._ask("testing", description=self.spec.raw.get("description", ""),
                          arguments=self.spec.raw["arguments"], dims=self.spec.raw["dims"],
                          constraints=self.spec.raw["shapes"].get("constraints", []),
                          spec_shapes=[c.dims for c in self.spec.shape_cases()][:40], models=_models(self.spec),
                          source=ctx.base_source, max_shapes=8, dim_names=", ".join(dims))
        proposed = json_block(reply)
        keep = []
        for item in proposed if isinstance(proposed, list) else []:
            if isinstance(item, dict) and set(item) == set(dims) and all(isinstance(v, int) and v > 0 for v in item.values()):
                if self._legal(item):
                    keep.append(item)
        return keep[:8]

    def _legal(self, dims: dict) -> bool:
        """The spec's own constraints decide which proposed shapes the kernel must handle."""
        from astra.spec.expr import ExprError, evaluate

        try:
            names = self.spec.names_for(dims, self.spec.dtypes[0])
            return all(evaluate(c, names) for c in self.spec.raw["shapes"].get("constraints") or [])
        except ExprError:
            return False

    def _ask(self, role: str, **values) -> str:
        messages = [{"role": "system", "content": templates.render("system", acceptance=policy_text())},
                    {"role": "user", "content": templates.render(role, **{**self._common(), **values})}]
        return self.client.chat(messages, role=role).text


def _models(spec) -> str:
    """The model configurations the spec's shapes come from (name and tensor-parallel size)."""
    models = [f"{m.get('model')} (tp {m.get('tp', 1)})" for m in spec.raw["shapes"].get("models") or []
              if isinstance(m, dict)]
    return ", ".join(models) or "none listed in the spec"


def _gpu(verdict: Verdict | None) -> str:
    return (verdict.env.get("gpu") if verdict else None) or "an NVIDIA Hopper GPU"


def _environment(verdict: Verdict | None) -> dict:
    """The verdict's environment, its plain values only (the nested performance model stays out)."""
    env = verdict.env if verdict else {}
    return {k: v for k, v in env.items() if isinstance(v, (str, int, float, bool))} or {"note": "not measured"}


def _best_text(ctx: Context, ideas: dict[int, str]) -> str:
    if ctx.best_n is None:
        return "The best is the original: no candidate has been verified faster yet."
    verdict = ctx.base_verdict
    return (f"Candidate #{ctx.best_n}, \"{ideas.get(ctx.best_n, 'idea not recorded')}\": "
            f"{one_line(verdict.reason, 300) if verdict else 'no verdict'}; speedups over the original per "
            f"view and band: {llm_context.speedups_text(verdict)}.")


def _best_source(ctx: Context) -> str:
    if ctx.best_n is None:
        return "// the same as the original above"
    return ctx.base_source

