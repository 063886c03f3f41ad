#!/usr/bin/env python3
"""loadtest/profile_top.py: the top frames of a profile, as shares of its samples.

Reads folded stacks (`inferno-collapse-perf`: "frame;frame;...;leaf count" a line) and prints
two markdown tables: the functions where the samples were taken (self), and the frames on
the stack (inclusive: each frame counted once per sample however deep it recurs), so the
report can say where the gateway's CPU goes, before and after a change.

    python3 loadtest/profile_top.py folded.txt [rows]
"""
import re
import sys
from collections import Counter

# Generic frames that are on nearly every stack and say nothing about where the time goes.
ROOTS = re.compile(r"^(\[unknown\]|_start|__libc_start|__clone|start_thread|std::sys::|"
                   r"std::thread::|core::ops::function::|std::rt::|main$|infergate::main|"
                   r"tokio::runtime::(context|scheduler|runtime|park|task::(raw|harness|core))|"
                   r"std::panic|std::panicking|__rust_try|__rust_begin_short_backtrace)")


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
    leaf, inclusive, threads, total = Counter(), Counter(), Counter(), 0
    for line in open(path, encoding="utf-8", errors="replace"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [short(f) for f in stack.split(";")]
        leaf[frames[-1]] += n
        threads[re.sub(r"[-_ ]?[0-9]+$", "", frames[0])] += n
        for f in set(frames[1:]):  # the first is the thread (comm)
            if not ROOTS.match(f):
                inclusive[f] += n
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
    print("\n| inclusive % | frame |\n|---:|---|")
    for f, n in inclusive.most_common(rows):
        print(f"| {100 * n / total:.1f} | `{f}` |")


if __name__ == "__main__":
    main()
