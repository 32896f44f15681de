"""The `strata` command line: argument parsing only; the work happens in `strata.commands`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

from strata import commands, env
from strata.bench import command as bench_command
from strata.engine.llm import DEVICES, DTYPES, ModelConfig
from strata.engine.llm_engine import EngineConfig
from strata.engine.sampler import SamplingParams
from strata.engine.scheduler import SchedulerConfig
from strata.gguf.reader import GGUFError
from strata.model_store import DEFAULT_MODEL, PACKAGED_MODELS, ModelNotAvailable, resolve_model
from strata.prompt.builtin_templates import BUILTIN_TEMPLATES
from strata.server.config import ServerConfig
from strata.server.model_config import ModelServingConfig, shipped_config

_MODEL_HELP = f"a GGUF file, or a packaged model: {', '.join(PACKAGED_MODELS)} (default {DEFAULT_MODEL})"


def _device_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=DEVICES, default="auto", help="auto: the GPU when there is one")
    p.add_argument(
        "--dtype",
        choices=("auto", *sorted(DTYPES)),
        default="auto",
        help="auto: bfloat16 on a GPU, float32 on the CPU",
    )
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        metavar="N",
        help="split every layer over N ranks: N GPUs on cuda, N processes on the CPU (default 1)",
    )


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
    _device_options(gen)
    _prompt_options(gen)

    tok = sub.add_parser("tokenize", help="show how text or a chat becomes tokens")
    source = tok.add_mutually_exclusive_group(required=True)
    source.add_argument("text", nargs="?", help="raw text (special-token strings in it are honoured)")
    source.add_argument("--chat", type=Path, metavar="FILE", help="JSON file of OpenAI-style messages")
    tok.add_argument("--model", default=DEFAULT_MODEL, help=_MODEL_HELP)
    tok.add_argument("--json", action="store_true", help="print one JSON object of parallel lists")
    tok.add_argument("--plain", action="store_true", help="treat raw text as untrusted plain text")
    _prompt_options(tok)

    srv = sub.add_parser("serve", help="serve the OpenAI-compatible API over HTTP")
    srv.add_argument("--model", default=DEFAULT_MODEL, help=_MODEL_HELP)
    srv.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--served-model-name", default=None, help="the model id clients see")
    key = srv.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="require this key on every route but /health")
    key.add_argument("--api-key-file", type=Path, default=None, help="read the API key from a file")
    _device_options(srv)
    srv.add_argument("--kv-tokens", type=int, default=32_768, help="KV cache size in tokens")
    srv.add_argument("--block-size", type=int, default=16)
    srv.add_argument("--max-num-seqs", type=int, default=16, help="sequences decoded together")
    srv.add_argument("--max-batched-tokens", type=int, default=2048, help="chunked-prefill budget per step")
    srv.add_argument(
        "--enforce-eager",
        action="store_true",
        help="GPU: run every step eagerly, capturing no CUDA graphs (they take a second or two to capture "
        "and the prefill ones 1-2 GiB of GPU memory; steps are slower without them)",
    )
    srv.add_argument(
        "--conversation-slots",
        type=int,
        default=None,
        help="prompts kept for incremental encoding (default: the model config's, 4)",
    )
    srv.add_argument(
        "--config",
        type=Path,
        default=None,
        help="per-model JSON config (sampling defaults, context size, ...); default: the one shipped "
        "for a packaged model",
    )
    _prompt_options(srv)

    info = sub.add_parser("info", help="describe a GGUF model")
    info.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=_MODEL_HELP)

    syn = sub.add_parser("synth", help="write a random-weight GGUF in the exact layout of a real model")
    syn.add_argument("spec", nargs="?", help="a built-in layout (see --list) or a JSON layout file")
    syn.add_argument("out", nargs="?", type=Path, help="the GGUF file to write")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--threads", type=int, default=None, help="generator threads (default: all cores)")
    syn.add_argument("--list", action="store_true", help="list the built-in layouts")

    bench = sub.add_parser("bench", help="time strata (decode, prefill) or two arms against each other (ab)")
    bench_command.add_arguments(bench, _MODEL_HELP, DEFAULT_MODEL)
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


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    scheduler = SchedulerConfig(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens
    )
    num_blocks = -(-args.kv_tokens // args.block_size)
    config = EngineConfig(num_blocks=num_blocks, block_size=args.block_size, scheduler=scheduler)
    return replace(config, cuda_graphs=False, prefill_graph_tokens=()) if args.enforce_eager else config


def _serve(args: argparse.Namespace) -> None:
    path = resolve_model(args.model)
    api_key = args.api_key
    if args.api_key_file is not None:
        api_key = args.api_key_file.read_text(encoding="utf-8").strip()
    model_config = ModelServingConfig.load(args.config) if args.config else shipped_config(args.model)
    slots = (
        args.conversation_slots if args.conversation_slots is not None else model_config.conversation_slots
    )
    server = ServerConfig(
        host=args.host,
        port=args.port,
        model_name=args.served_model_name or (args.model if args.model in PACKAGED_MODELS else path.stem),
        api_key=api_key,
        trust_prompts=args.trust_prompts,
        conversation_slots=slots,
    )
    engine = _engine_config(args)
    model = ModelConfig(path, args.dtype, args.chat_template, args.device, args.tensor_parallel)
    commands.serve(model, engine, server, model_config)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    threads = env.num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        if args.command == "info":
            commands.info(resolve_model(args.model))
        elif args.command == "synth":
            from strata.synth.command import synth_command

            synth_command(args.spec, args.out, args.seed, args.threads, args.list)
        elif args.command == "bench":
            return bench_command.main(args)
        elif args.command == "generate":
            sampling = SamplingParams(
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
                seed=args.seed,
            )
            config = ModelConfig(
                resolve_model(args.model), args.dtype, args.chat_template, args.device, args.tensor_parallel
            )
            request = commands.GenerateRequest(args.text, args.chat, sampling, protect=not args.trust_prompts)
            commands.generate(config, request)
        elif args.command == "serve":
            _serve(args)
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
