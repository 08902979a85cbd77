"""The LLM agent: testing, profiling, planning and coding roles on any OpenAI-compatible endpoint.

The roles are prompt templates (astra/prompts/*.md) and one client; the loop does not know which
agent it drives. Each round: profile the current best from its verdict, plan one change, code it as
search/replace edits; an edit that does not apply goes back to the model with the error written
for it (which block, the nearest real lines, what applied), up to `edit_attempts` times. The testing
role runs once per run and adds shapes to the suite (spec shapes are never removed).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict

from astra.optimize import llm, templates
from astra.optimize.edits import apply_reply
from astra.optimize.loop import Context
from astra.optimize.transforms import Proposal
from astra.report.safe_text import one_line
from harness import Verdict, policy_text

_JSON = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def _json_block(text: str):
    """The first JSON value in a reply (fenced or bare); None when there is none."""
    for candidate in [m.group(1) for m in _JSON.finditer(text)] + [text]:
        try:
            return json.loads(candidate.strip())
        except (json.JSONDecodeError, ValueError):
            continue
    return None


def measurements(verdict: Verdict | None, limit: int = 40) -> str:
    """A compact per-shape table of a verdict for the prompts."""
    lines = ["shape | band | graph us | cold us | roofline (graph) | copy us"]
    for case in (verdict.cases if verdict else [])[:limit]:
        if not case.timed:
            continue
        g, c = case.median_us("graph", "cand"), case.median_us("cold", "cand")
        r = (case.roofline.get("graph") or {}).get("cand_fraction")
        lines.append(f"{case.id} | {case.band} | {g} | {c} | {r if r is None else round(r, 3)} | {case.copy_us}")
    return "\n".join(lines)


class LLMAgent:
    def __init__(self, client: llm.Client, spec, tree, edit_attempts: int = 3):
        self.client, self.spec, self.tree = client, spec, tree
        self.edit_attempts = edit_attempts
        self.name = f"llm:{client.cfg.model}"
        self.extra_shapes: list[dict] = []
        self.rationale = ""
        self._tested = False

    def usage(self) -> tuple[int, float]:
        total = self.client.usage.total()
        return total.tokens, float(total.cost_usd or 0.0)

    def _common(self) -> dict:
        return {"kernel": self.spec.name, "sglang_version": self.tree.version, "kernel_file": self.spec.kernel_file}

    def propose(self, ctx: Context) -> list[Proposal]:
        if not self._tested:
            self._tested = True
            self.extra_shapes = self.test_shapes(ctx)
        env = ctx.base_verdict.env if ctx.base_verdict else {}
        profile = self._ask("profiling", gpu=_gpu(ctx.base_verdict), environment=env,
                            copy_bandwidth=env.get("copy_bandwidth_Bps"),
                            measurements=measurements(ctx.base_verdict),
                            resources=[b.get("resources") for b in (ctx.base_verdict.builds if ctx.base_verdict else [])][:2],
                            ncu="not available", source=ctx.base_source)
        plan_text = self._ask("planning", gpu=_gpu(ctx.base_verdict), description=self.spec.raw.get("description", ""),
                              source=ctx.base_source, profile=profile,
                              best=[asdict(h) for h in ctx.history[-1:]] or "the original",
                              history=[asdict(h) for h in ctx.history[-12:]] or "nothing tried yet",
                              iterations_left="see budget")
        plan = _json_block(plan_text) or {}
        if isinstance(plan, dict) and plan.get("stop"):
            self.rationale = self._safe(f"the planner stopped: {plan.get('rationale', '')}", 200)
            return []
        idea = plan.get("idea") if isinstance(plan, dict) else None
        self.rationale = self._safe(idea if isinstance(idea, str) and idea.strip() else plan_text.strip(), 120)
        source = self._code(ctx.base_source, plan_text)
        if source is None:
            return []
        return [Proposal(f"llm:r{ctx.round}", "llm", self.rationale, self.client.redact(source))]

    def _safe(self, text: str, limit: int) -> str:
        """Model text bound for the terminal, the report and meta.json: no key, no control characters."""
        return one_line(self.client.redact(str(text)), limit)

    def _code(self, base: str, plan_text: str) -> str | None:
        exports = [w["export"] + " -> " + w["entry"] for w in self.spec.raw["build"].get("wrappers", [])]
        feedback = "none"
        for _ in range(self.edit_attempts):
            reply = self._ask("coding", plan=plan_text, exports="\n".join(exports), feedback=feedback, source=base)
            result = apply_reply(base, reply, filename=self.spec.kernel_file)
            if result.ok and result.new_text != base:
                return result.new_text
            feedback = result.feedback() if not result.ok else "Your reply changed nothing; make the planned change."
        self.rationale = f"no applicable edit in {self.edit_attempts} attempts"
        return None

    def test_shapes(self, ctx: Context) -> list[dict]:
        """Extra shapes from the testing role, kept only where every spec dim is given as an int."""
        dims = list(self.spec.raw["dims"])
        reply = self._ask("testing", description=self.spec.raw.get("description", ""),
                          arguments=self.spec.raw["arguments"], dims=self.spec.raw["dims"],
                          constraints=self.spec.raw["shapes"].get("constraints", []),
                          spec_shapes=[c.dims for c in self.spec.shape_cases()][:40], models="the spec's models",
                          source=ctx.base_source, max_shapes=8, dim_names=", ".join(dims))
        proposed = _json_block(reply)
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


def _gpu(verdict: Verdict | None) -> str:
    return (verdict.env.get("gpu") if verdict else None) or "an NVIDIA Hopper GPU"
