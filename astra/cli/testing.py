"""The testing agent at the command line: `--agent llm` on `extract` (the model proposes a draft from the
evidence) and on `probe` (the model repairs a draft the probe rejected, after the message rules). The probe
decides either way; nothing the model writes is trusted before it passes."""

from __future__ import annotations

from pathlib import Path

from astra import paths
from astra.errors import AstraError


def wants_llm(args) -> bool:
    return getattr(args, "agent", "rules") == "llm"


def check_llm_config(args) -> None:
    """Refuse unusable LLM settings before any work is done (exit 13): $ASTRA_HOME/config.yaml (astra.config),
    and an endpoint URL, from --base-url, the file or the environment, that no request can go to."""
    from astra.llm.client import resolve_config

    flags = {"base_url": getattr(args, "base_url", None), "model": getattr(args, "model", None)}
    resolve_config({k: v for k, v in flags.items() if v is not None})


def client(args, transcript: Path):
    """An LLM client from --model/--base-url/--budget-* > $ASTRA_HOME/config.yaml > environment."""
    from astra.llm.client import Client, resolve_config

    flags = {"base_url": args.base_url, "model": args.model, "budget_tokens": args.budget_tokens,
             "budget_usd": args.budget_usd}
    cfg = resolve_config({k: v for k, v in flags.items() if v is not None})
    if not cfg.model:
        raise AstraError("--agent llm: no model named; pass --model (and --base-url), set `model:` in "
                         "$ASTRA_HOME/config.yaml or ASTRA_MODEL")
    return Client(cfg, transcript=transcript)


def propose_drafts(args, sglang, drafted: list[tuple[str, Path, list[str]]], say=print) -> int:
    """After `astra extract`: the model's draft for each (module name, draft path, notes); written over the
    inferred draft when the model's reply was accepted (the note names the agent). Returns how many."""
    import yaml

    from astra.spec.llm_draft import propose_draft, write_draft

    llm = client(args, paths.drafts_dir() / "testing-agent.jsonl")
    changed = 0
    for name, draft, notes in drafted:
        inferred = yaml.safe_load(draft.read_text(errors="replace"))
        spec, note = propose_draft(sglang, inferred.get("module", name), inferred, notes, llm, path=draft)
        if spec is not inferred:
            write_draft(draft, spec, note)
            changed += 1
        say(f"agent  {name}: {note}")
    say(f"testing agent: {changed} of {len(drafted)} draft(s) rewritten by the model; {llm.usage.summary()}")
    return changed


def repairers(args) -> list:
    """The probe's repairers: the kernel-message rules, then (with --agent llm) the model."""
    from astra.verify import message_repair

    out: list = [message_repair.MessageRepairer()]
    if wants_llm(args):
        from astra.spec.llm_draft import LlmRepairer

        out.append(LlmRepairer(client(args, paths.drafts_dir() / "testing-agent.jsonl")))
    return out
