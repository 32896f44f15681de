"""The `strata` command line: argument parsing only; the work happens in `strata.commands`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from strata import commands, env
from strata.engine.llm import DTYPES, ModelConfig
from strata.engine.sampler import SamplingParams
from strata.gguf.reader import GGUFError
from strata.model_store import DEFAULT_MODEL, PACKAGED_MODELS, ModelNotAvailable, resolve_model
from strata.prompt.builtin_templates import BUILTIN_TEMPLATES

_MODEL_HELP = f"a GGUF file, or a packaged model: {', '.join(PACKAGED_MODELS)} (default {DEFAULT_MODEL})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description="Run GGUF language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion of TEXT to the terminal")
    gen.add_argument("text")
    gen.add_argument("--chat", action="store_true", help="send TEXT as a user message through the template")
    gen.add_argument("--model", default=DEFAULT_MODEL, help=_MODEL_HELP)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    _prompt_options(gen)

    tok = sub.add_parser("tokenize", help="show how text or a chat becomes tokens")
    source = tok.add_mutually_exclusive_group(required=True)
    source.add_argument("text", nargs="?", help="raw text (special-token strings in it are honoured)")
    source.add_argument("--chat", type=Path, metavar="FILE", help="JSON file of OpenAI-style messages")
    tok.add_argument("--model", default=DEFAULT_MODEL, help=_MODEL_HELP)
    tok.add_argument("--json", action="store_true", help="print one JSON object of parallel lists")
    tok.add_argument("--plain", action="store_true", help="treat raw text as untrusted plain text")
    _prompt_options(tok)

    info = sub.add_parser("info", help="describe a GGUF model")
    info.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=_MODEL_HELP)
    return parser


def _prompt_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chat-template", choices=sorted(BUILTIN_TEMPLATES), help="use a built-in template, not the file's"
    )
    parser.add_argument(
        "--trust-prompts",
        action="store_true",
        help="let message content produce special tokens (only for trusted clients; off by default)",
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    threads = env.num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        if args.command == "info":
            commands.info(resolve_model(args.model))
        elif args.command == "generate":
            sampling = SamplingParams(
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
                seed=args.seed,
            )
            config = ModelConfig(resolve_model(args.model), args.dtype, args.chat_template)
            request = commands.GenerateRequest(args.text, args.chat, sampling, protect=not args.trust_prompts)
            commands.generate(config, request)
        elif args.command == "tokenize":
            tokenize = commands.TokenizeRequest(
                text=args.text,
                chat_file=args.chat,
                as_json=args.json,
                protect=not args.trust_prompts,
                plain_text=args.plain,
                builtin_template=args.chat_template,
            )
            commands.tokenize(resolve_model(args.model), tokenize)
    except (GGUFError, ModelNotAvailable, ValueError) as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
