"""`specula bench --via cli,window,serve,serve-stream,llama-server`: plain decoding and the
window's default drafter timed where users meet them, paired.

Every way is started and loaded before anything is timed, and stays loaded: Specula's own loop in
this process (`cli`), the real window offscreen in a child process (`window`: app.ui.shell.drive,
the worker thread beside Qt's GUI thread, the chat streaming and the charts redrawing), `specula
serve` in a child process over HTTP (`serve`, and `serve-stream` for the same server streamed), and
llama-server over HTTP with the same model, the same chat frame (ours, for a model without a chat
template) and llama.cpp's names for the same drafters. Each round sends the same chat to every way
in turn, each after a short warm-up reply of its own, the order reversed every other round
(A B C C B A ...), so that drift and background load fall on all alike; each way's figure is its
own decode rate (llama.cpp's rule: the steps after the first token), its ratio to `cli` taken
within the round, and the table shows each ratio's median over the rounds."""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from app.cli.bench.common import PROMPTS
from app.engine.errors import SpeculaError
from app.engine.loop.chat import FALLBACK_STOPS, FALLBACK_TEMPLATE

log = logging.getLogger(__name__)

WAYS = ("cli", "window", "serve", "serve-stream", "llama-server", "llama-server-each")
# llama-server-each: for a drafted row, llama-server once per model-free --spec-type, so that our
# drafter meets llama.cpp's best type here, not only its types of the same names.
MODEL_FREE_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFTERS = ("none", "lookup+ngram-cache+ngram-mod")  # plain decoding and the window's default drafter
START_TIMEOUT_S = 300.0
# A pause before each timed reply: the way before it may still be finishing up (the window
# renders and saves the reply it just ended, a server logs), work that would fall on the next.
SETTLE_S = 0.5
# Before each timed reply, a short one of the same way: each is then timed warm, as a user's
# engine is in a chat, not just after another process ran. Without it a way ran slower right
# after llama-server than after our own window: SmolLM2's serve/llama-server was 0.80-0.97x in
# the rounds where serve followed llama-server and 1.00-1.06x in the others (this Xeon's 480 MiB
# L3 holds the 93 MiB of weights: likely whose were in it).
WARM_TOKENS = 8


def spec_types(kind: str) -> list[str]:
    """llama.cpp's --spec-type names of one of our n-gram kinds ("none" for plain decoding)."""
    from app.engine.drafting.kinds import KIND_OF_SPEC_TYPE

    names = {kind_: spec for spec, kind_ in KIND_OF_SPEC_TYPE.items()}
    return [names[part] for part in kind.split("+")] if kind != "none" else ["none"]


def cpu_name() -> str:
    """The CPU's model name as lscpu shows it (every figure names its CPU)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def self_command() -> list[str]:
    """How to start Specula itself (the bundle's executable where frozen: it has no `-m app`)."""
    from app.desktop_entry import launcher_command

    return launcher_command()


@dataclass
class Way:
    """One place a reply runs: `reply(text, n)` -> (decode tok/s, the reply's text); `close()`
    stops what it started."""

    name: str
    reply: Callable[[str, int], tuple[float, str]]
    close: Callable[[], None] = lambda: None
    gui_shares: list[float] = field(default_factory=list)  # the window: its GUI thread's CPU / the reply's wall


def open_cli(model: Path, kind: str) -> Way:
    from app.engine.pair_loader import PairSpec
    from app.engine.reply_engine import open_session
    from app.engine.session import Prompt
    from app.engine.settings import GenSettings

    session = open_session(PairSpec(model, ngram=kind))

    def reply(text: str, n: int) -> tuple[float, str]:
        settings = GenSettings(max_tokens=n, temperature=0.0).decode_settings()
        summary = [e for e in session.reply(Prompt.chat([{"role": "user", "content": text}]), settings)][-1].summary
        return summary.decode_tps, summary.text

    return Way("cli", reply, session.close)


class Window:
    """The window driven line by line (app.ui.shell.drive) in a child process."""

    def __init__(self, model: Path, kind: str) -> None:
        from app.engine.llama_server.programs import start_program

        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "QT_LOGGING_RULES": "qt.qpa.*=false"}
        self.process = start_program([*self_command(), "--drive-window"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.gui_shares: list[float] = []
        self._answer()  # ready
        self._ask({"cmd": "load", "main": str(model), "drafter": kind})

    def _ask(self, command: dict) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise SpeculaError("the window closed")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise SpeculaError(f"the window: {answer.get('error')}")
        return answer

    def reply(self, text: str, n: int) -> tuple[float, str]:
        answer = self._ask({"cmd": "reply", "text": text, "max_tokens": n, "plain": False})
        self.gui_shares.append(answer["gui_cpu_s"] / answer["wall_s"] if answer["wall_s"] > 0 else 0.0)
        return answer["summary"]["decode_tps"], answer["summary"]["text"]

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=30)
        except Exception:  # noqa: BLE001 - stopping is best effort; kill it
            self.process.kill()


def open_window(model: Path, kind: str) -> Way:
    window = Window(model, kind)
    return Way("window", window.reply, window.close, window.gui_shares)


class HttpServer:
    """`specula serve` or llama-server in a child process, asked over OpenAI's chat API; the
    figure is the server's own timings.predicted_per_second (the same rule for both)."""

    def __init__(self, command: list[str], port: int, stops: tuple[str, ...] = (),
                 remove_at_close: Path | None = None) -> None:
        from app.engine.llama_server.programs import start_program
        from app.engine.remote.http import RemoteHttp

        self.stops, self._remove_at_close = stops, remove_at_close  # a chat frame given to llama-server
        self.process = start_program(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.http = RemoteHttp(f"http://127.0.0.1:{port}", None, 600.0)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if self.http.get_json("/health", timeout_s=2.0):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SpeculaError(f"{command[0]} did not start")
            time.sleep(0.2)

    def reply(self, text: str, n: int, stream: bool = False) -> tuple[float, str]:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": n, "temperature": 0.0,
                **({"stop": list(self.stops)} if self.stops else {})}
        if not stream:
            whole = self.http.post_json("/v1/chat/completions", body)
            return whole["timings"]["predicted_per_second"], whole["choices"][0]["message"]["content"]
        timings, parts = None, []
        for chunk in self.http.stream_events("/v1/chat/completions", {**body, "stream": True}):
            if not isinstance(chunk, dict):
                continue
            timings = chunk.get("timings", timings)
            for choice in chunk.get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
        return timings["predicted_per_second"], "".join(parts)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        if self._remove_at_close is not None:
            self._remove_at_close.unlink(missing_ok=True)


def open_serve(model: Path, kind: str, stream_too: bool) -> list[Way]:
    from app.engine.llama_server.process import free_port

    port = free_port()
    server = HttpServer([*self_command(), "serve", "-m", str(model), "--port", str(port), "--temp", "0",
                         "--spec-type", ",".join(spec_types(kind))], port)
    ways = [Way("serve", server.reply, server.close)]
    if stream_too:
        ways.append(Way("serve-stream", lambda text, n: server.reply(text, n, stream=True)))
    return ways


def open_llama_server(model: Path, kind: str, types: list[str] | None = None, name: str = "llama-server") -> Way:
    """llama-server with llama.cpp's names for `kind`'s drafters, or with `types`."""
    from app.engine.llama_server.process import free_port
    from app.engine.llama_server.programs import SERVER, find_program, missing_reason

    program = find_program(SERVER)
    if program is None:
        raise SpeculaError(missing_reason(SERVER))
    port = free_port()
    types = [t for t in spec_types(kind) if t != "none"] if types is None else types
    frame = fallback_frame_file(model)
    server = HttpServer([str(program), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                         "--parallel", "1", "--no-webui", "--swa-full", "--temp", "0",
                         *(["--spec-type", ",".join(types)] if types else []),
                         *(["--chat-template-file", str(frame)] if frame else [])],
                        port, FALLBACK_STOPS if frame else (), frame)
    return Way(name, server.reply, server.close)


def fallback_frame_file(model: Path) -> Path | None:
    """For a model without a chat template, our fallback frame as a file for llama-server's
    --chat-template-file (None where the model has its own template). Without it llama-server
    frames the chat in ChatML, which such a model has never seen: Gemma 3 270M then answered
    "<|im_start|>user\n<|im_end|>user..." over and over, a reply any n-gram drafter predicts
    whole, and the two servers' drafters were timed on different replies."""
    from app.engine.gguf.info import read_gguf_info

    if read_gguf_info(model).has_chat_template:
        return None
    handle, name = tempfile.mkstemp(prefix="specula-bench-frame-", suffix=".jinja")
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        file.write(FALLBACK_TEMPLATE)
    return Path(name)


def open_each_type(model: Path, kind: str) -> list[Way]:
    """llama-server once per model-free type, for a drafted row (plain decoding has one way)."""
    if kind == "none":
        return []
    return [open_llama_server(model, kind, [t], f"llama-server:{t}") for t in MODEL_FREE_TYPES]


def open_ways(model: Path, kind: str, ways: list[str]) -> list[Way]:
    opened: list[Way] = []
    try:
        for name in ways:
            if name == "cli":
                opened.append(open_cli(model, kind))
            elif name == "window":
                opened.append(open_window(model, kind))
            elif name == "serve":
                opened += open_serve(model, kind, "serve-stream" in ways)
            elif name == "llama-server":
                opened.append(open_llama_server(model, kind))
            elif name == "llama-server-each":
                opened += open_each_type(model, kind)
    except BaseException:
        for way in opened:
            way.close()
        raise
    return opened


@dataclass
class Cell:
    rates: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # to cli in the same round
    other_text: int = 0  # rounds whose reply was not cli's (another prompt or a near-tie)
    first_other: str | None = None  # where the first such reply left cli's, in words


def run_rounds(ways: list[Way], text: str, n: int, rounds: int) -> dict[str, Cell]:
    """Each round: every way once, in turn (reversed every other round), warmed up first."""
    for way in ways:
        way.reply(text, min(n, 16))
    cells = {way.name: Cell() for way in ways}
    for r in range(rounds):
        order = ways if r % 2 == 0 else list(reversed(ways))
        replies = {}
        for way in order:
            time.sleep(SETTLE_S)
            way.reply(text, WARM_TOKENS)
            replies[way.name] = way.reply(text, n)
        cli_rate, cli_text = replies.get("cli", (0.0, None))
        for name, (rate, reply_text) in replies.items():
            cells[name].rates.append(rate)
            if cli_rate > 0:
                cells[name].ratios.append(rate / cli_rate)
            if cli_text is not None and reply_text != cli_text:
                cells[name].other_text += 1
                cells[name].first_other = cells[name].first_other or where_apart(cli_text, reply_text)
    return cells


def where_apart(cli_text: str, text: str) -> str:
    """Where `text` leaves cli's reply: the character and a few on each side of both."""
    at = next((i for i, (a, b) in enumerate(zip(cli_text, text)) if a != b), min(len(cli_text), len(text)))
    start = max(0, at - 12)
    return f"at character {at}: {text[start:at + 12]!r}, cli {cli_text[start:at + 12]!r}"


def cmd_bench_where(args: Any) -> int:
    from app.cli.spec_args import UsageError
    from app.hub.builtin import resolve_model_arg

    wanted = [w.strip() for w in args.via.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in WAYS]
    if unknown or not wanted:
        raise UsageError(f"--via: {unknown[0] if unknown else '(none)'} is not one of {', '.join(WAYS)}")
    if "serve-stream" in wanted and "serve" not in wanted:
        wanted.append("serve")
    model = resolve_model_arg(args.model)
    text = PROMPTS.get(args.prompts.split(",")[0], PROMPTS["code-rewrite"])
    print(f"# {model.name} on {cpu_name()}: greedy, n={args.n_predict}, {args.repeat} paired rounds per drafter; "
          f"each way's decode tok/s (median) and its ratio to cli in the same round (median); "
          f"†N: N rounds whose reply was not cli's")
    names = [w for w in WAYS if w in wanted and w != "llama-server-each"]
    if "llama-server-each" in wanted:
        names += [f"llama-server:{t}" for t in MODEL_FREE_TYPES]
    print("| drafter | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for kind in DRAFTERS:
        ways = open_ways(model, kind, [w for w in WAYS if w in wanted])
        try:
            cells = run_rounds(ways, text, args.n_predict, max(1, args.repeat))
        finally:
            for way in ways:
                way.close()
        shown = []
        for name in names:
            cell = cells.get(name)
            if cell is None:  # llama-server's types on the plain row
                shown.append("")
                continue
            rate = statistics.median(cell.rates)
            ratio = f" ({statistics.median(cell.ratios):.2f}x)" if name != "cli" and cell.ratios else ""
            other = f" †{cell.other_text}" if cell.other_text else ""  # rounds with another reply than cli's
            shown.append(f"{rate:.1f}{ratio}{other}")
        print(f"| {kind} | " + " | ".join(shown) + " |", flush=True)
        for name in names:
            if name in cells and cells[name].first_other:
                print(f"#   {kind}: {name}'s reply left cli's in {cells[name].other_text} rounds, first {cells[name].first_other}")
        gui = next((way.gui_shares for way in ways if way.gui_shares), None)
        if gui:
            print(f"#   {kind}: the window's GUI thread was busy {100 * statistics.median(gui):.0f}% of a reply's wall time")
        if "serve" in cells and "llama-server" in cells:
            pairs = [s / l for s, l in zip(cells["serve"].rates, cells["llama-server"].rates) if l > 0]
            if pairs:
                print(f"#   {kind}: serve / llama-server, paired median {statistics.median(pairs):.3f}x")
        best = best_server_line(kind, cells)
        if best:
            print(best)
    return 0


def best_server_line(kind: str, cells: dict[str, Cell]) -> str | None:
    """Our served drafter against llama-server's fastest way on this row (the type with the
    highest median rate), paired round by round."""
    servers = {name: cell for name, cell in cells.items() if name.startswith("llama-server:") and cell.rates}
    if "serve" not in cells or len(servers) < 2:
        return None
    if "llama-server" in cells:
        servers[f"llama-server:{','.join(spec_types(kind))}"] = cells["llama-server"]
    name, cell = max(servers.items(), key=lambda item: statistics.median(item[1].rates))
    pairs = [s / r for s, r in zip(cells["serve"].rates, cell.rates) if r > 0]
    return (f"#   {kind}: serve / llama-server's best type here ({name.split(':', 1)[1]}, "
            f"{statistics.median(cell.rates):.1f} tok/s), paired median {statistics.median(pairs):.3f}x")
