#!/usr/bin/env python3
"""loadtest/profile_top.py: the top frames of a profile, as shares of its samples.

Reads folded stacks (`inferno-collapse-perf`: "frame;frame;...;leaf count" a line) and prints
markdown tables: the threads, the functions where the samples were taken (self), and the
samples by owner: the crate (or infergate module) of the deepest frame that is not the
standard library, or the syscall a stack is in. Async Rust wraps every frame in generic
`poll`s, so the owner says more than inclusive shares do about where the gateway's CPU goes,
before and after a change.

    python3 loadtest/profile_top.py folded.txt [rows]
"""
import re
import sys
from collections import Counter

SYSCALLS = {"__GI___writev": "kernel: writev", "__libc_recv": "kernel: recv",
            "epoll_wait": "kernel: epoll_wait", "__GI___libc_write": "kernel: write",
            "__libc_send": "kernel: send", "__GI___libc_read": "kernel: read"}
LIBC = re.compile(r"malloc|free|calloc|realloc|memcpy|memmove|tcache|unlink_chunk|consolidate")
STD = re.compile(r"^<?(core|alloc|std)::")
CRATE = re.compile(r"^<?([a-z_][a-z0-9_]*)::([A-Za-z_][A-Za-z0-9_]*)(?:::([A-Za-z_][A-Za-z0-9_]*))?")


def owner(frames):
    """The syscall a stack is in, else the crate of its deepest non-std frame (infergate:
    the module), with `libc malloc/memcpy <-` when the sample is in the allocator or a copy."""
    libc = None
    for f in reversed(frames[1:]):
        if f in SYSCALLS:
            return SYSCALLS[f]
        if "::" not in f:
            if libc is None and LIBC.search(f):
                libc = "memcpy" if "mem" in f else "malloc"
            continue
        if STD.match(f):
            continue
        m = CRATE.match(f)
        if m:
            name = m.group(1)
            if name == "infergate":
                name += "::" + m.group(2)
                if m.group(3) and m.group(2) in ("frontend", "pipeline", "upstream", "validate", "auth", "listen"):
                    name += "::" + m.group(3)
            return f"libc {libc} <- {name}" if libc else name
    return "kernel / other"


def strip_generics(text):
    """`a::B<C<D>>::f` -> `a::B::f`."""
    depth, out = 0, []
    for ch in text:
        if ch == "<":
            depth += 1
        if depth == 0:
            out.append(ch)
        if ch == ">":
            depth = max(0, depth - 1)
    return "".join(out)


def short(frame):
    """A frame without its generic arguments and hash, `<T as Trait>::f` as `T::f`, cut to a
    readable length."""
    frame = re.sub(r"::h[0-9a-f]{16}$", "", frame)
    if frame.startswith("<"):
        depth = 0
        for i, ch in enumerate(frame):
            depth += (ch == "<") - (ch == ">")
            if depth == 0:
                inner, rest = frame[1:i], frame[i + 1:]
                break
        else:
            inner, rest = frame, ""
        depth, cut = 0, len(inner)
        for i, ch in enumerate(inner):
            depth += (ch == "<") - (ch == ">")
            if depth == 0 and inner.startswith(" as ", i):
                cut = i
                break
        frame = strip_generics(inner[:cut]) + rest
    text = strip_generics(frame).replace("::{{closure}}", "").replace("{closure#0}", "{closure}").strip() or frame
    return text if len(text) <= 90 else "..." + text[-87:]


def main():
    path, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15
    leaf, owners, threads, total = Counter(), Counter(), Counter(), 0
    for line in open(path, encoding="utf-8", errors="replace"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        raw = stack.split(";")  # the first is the thread (comm)
        leaf[short(raw[-1])] += n
        threads[re.sub(r"[-_ ]?[0-9]+$", "", raw[0])] += n
        owners[owner(raw)] += n
    if not total:
        print("(no samples)")
        return
    print(f"Total weight {total}.\n")
    print("| thread | % |\n|---|---:|")
    for t, n in threads.most_common(6):
        print(f"| `{t}` | {100 * n / total:.1f} |")
    print("\n| self % | function |\n|---:|---|")
    for f, n in leaf.most_common(rows):
        print(f"| {100 * n / total:.1f} | `{f}` |")
    print("\n| % | owner (syscall, or crate of the deepest non-std frame) |\n|---:|---|")
    for f, n in owners.most_common(rows + 10):
        print(f"| {100 * n / total:.1f} | `{f}` |")


if __name__ == "__main__":
    main()
