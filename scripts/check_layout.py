#!/usr/bin/python3
"""The rules of docs/architecture.md, checked (scripts/check.sh runs this):

1. includes: every `#include "..."` of a tracked C file is resolved to a file of the tree and must
   be allowed by the table "Which module may include which" of docs/architecture.md: the module
   that owns the including file may include its own files and those of the modules its row
   lists. The table is read from the doc itself, between the markers
   <!-- include-rules:begin --> and <!-- include-rules:end -->, so the doc and the check cannot
   drift. A file belongs to the module whose `files` entry is its longest matching prefix.
2. public headers include no MPI, ZeroMQ, CUDA, NCCL or cuBLAS header (users' builds must not
   need them).
3. one clock: no file outside common/src/core/clock.c reads a clock itself (clock_gettime,
   gettimeofday, time(NULL)); tests and benchmarks (programs of their own) are exempt.
4. globals: every file-scope variable of the library, the kernels and the role folders that is
   not const is listed in the table "Mutable globals" of docs/architecture.md (between
   <!-- globals:begin --> and <!-- globals:end -->), with its reason.
5. the meson split: role folders declare their dependencies on the core's public side
   (core_public_dep); only the core, the role libraries, the tests and the benchmarks compile
   against its internal headers (core_dep).

Prints "path:line: what" per violation and exits 1 if there is any.
  /usr/bin/python3 scripts/check_layout.py [--root DIR]
"""
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DOC = "docs/architecture.md"
INCLUDE_ROOTS = ["common/include", "common/src", "."]
FORBIDDEN_IN_PUBLIC = re.compile(r"^(mpi|zmq|nccl|cuda[\w]*|cublas[\w]*|cudnn[\w]*)\.h$")
CLOCK_CALL = re.compile(r"\b(clock_gettime|gettimeofday)\s*\(|\btime\s*\(\s*NULL\s*\)")

violations = []


def report(path, line, what):
    violations.append(f"{path}:{line}: {what}")


def tracked(*patterns):
    out = subprocess.check_output(["git", "ls-files", *patterns], cwd=ROOT).decode()
    return [f for f in out.split("\n") if f]


def table(marker):
    """The rows of the markdown table between <!-- marker:begin --> and <!-- marker:end -->, as
    lists of cells, with the line number of each row."""
    text = open(os.path.join(ROOT, DOC)).read().split("\n")
    try:
        begin = next(i for i, l in enumerate(text) if f"<!-- {marker}:begin" in l)
        end = next(i for i, l in enumerate(text) if f"<!-- {marker}:end" in l)
    except StopIteration:
        report(DOC, 1, f"no table between <!-- {marker}:begin --> and <!-- {marker}:end -->")
        return []
    rows = []
    for i in range(begin + 1, end):
        line = text[i].strip()
        if not line.startswith("|") or re.match(r"^\|[\s|:-]+\|$", line):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((i + 1, cells))
    return rows[1:]  # the header row


def code_spans(cell):
    return re.findall(r"`([^`]+)`", cell)


def read_modules():
    """module name -> (prefixes, allowed module names)."""
    modules = {}
    for line, cells in table("include-rules"):
        if len(cells) < 3:
            report(DOC, line, "an include-rules row needs: module | files | may include | why")
            continue
        name = cells[0].strip("`* ").replace(" ", "-")
        prefixes = code_spans(cells[1])
        allowed = [m.strip("` ") for m in re.split(r"[,\s]+", cells[2]) if m.strip("` -")]
        modules[name] = (prefixes, allowed, line)
    for name, (_, allowed, line) in modules.items():
        for m in allowed:
            if m not in modules and m not in ("all", "all-public"):
                report(DOC, line, f"module {name} may include unknown module '{m}'")
    return modules


def owner(path, modules):
    best, best_len = None, -1
    for name, (prefixes, _, _) in modules.items():
        for p in prefixes:
            if (path == p or path.startswith(p)) and len(p) > best_len:
                best, best_len = name, len(p)
    return best


def resolve(src, inc):
    for base in [os.path.dirname(src)] + INCLUDE_ROOTS:
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(ROOT, cand)):
            return cand
    if inc.endswith(".pb-c.h"):  # generated from common/proto/NAME.proto at build time
        return "common/proto/" + inc[: -len(".pb-c.h")] + ".proto"
    return None


def check_includes(files):
    modules = read_modules()
    if not modules:
        return
    for f in files:
        mine = owner(f, modules)
        if mine is None:
            report(f, 1, f"belongs to no module of the include table in {DOC} (add its folder)")
            continue
        allowed = set(modules[mine][1]) | {mine}
        for n, text in enumerate(open(os.path.join(ROOT, f), errors="replace"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', text)
            if m:
                target = resolve(f, m.group(1))
                if target is None:
                    report(f, n, f'#include "{m.group(1)}" is no file of the tree')
                    continue
                theirs = owner(target, modules)
                if theirs is None:
                    report(f, n, f"{target} belongs to no module of the include table in {DOC}")
                elif (theirs not in allowed and "all" not in allowed and
                      not ("all-public" in allowed and target.startswith("common/include/"))):
                    report(f, n, f'#include "{m.group(1)}": {mine} may not include {theirs} '
                                 f"({target}); see the include table in {DOC}")
            m = re.match(r"\s*#\s*include\s+<([^>]+)>", text)
            if m and f.startswith("common/include/") and FORBIDDEN_IN_PUBLIC.match(
                    os.path.basename(m.group(1))):
                report(f, n, f"a public header includes <{m.group(1)}>: users' builds would "
                             "need it (include it in a .c file)")


def check_clock(files):
    for f in files:
        if f == "common/src/core/clock.c" or f.startswith(("tests/", "scripts/")):
            continue
        for n, text in enumerate(open(os.path.join(ROOT, f), errors="replace"), 1):
            code = text.split("//")[0]
            if CLOCK_CALL.search(code) and not code.lstrip().startswith(("*", "/*")):
                report(f, n, "reads a clock itself: use core/clock.h (ct__now_s, ct__now_ns, "
                             "ct__wall_ns, ct__wall_s, ct__deadline_s)")


def file_scope_variables(files):
    """(path, line, name, declaration text) of every file-scope variable definition that is not
    const, from universal-ctags."""
    out = subprocess.run(["ctags", "--c-kinds=v", "--fields=+nS", "-x", "--_xformat=%N\t%F\t%n",
                          *files], cwd=ROOT, capture_output=True, text=True).stdout
    found = []
    for row in out.split("\n"):
        if not row:
            continue
        name, path, line = row.split("\t")
        lines = open(os.path.join(ROOT, path), errors="replace").read().split("\n")
        i = int(line) - 1
        decl = lines[i]
        # a struct variable's type starts on an earlier line: walk up to the line that opens it
        j = i
        if decl.lstrip().startswith("}"):
            depth = 1  # the "}" that closes the type
            while j > 0 and depth > 0:
                j -= 1
                depth += lines[j].count("}") - lines[j].count("{")
        text = " ".join(lines[j:i + 1])
        while re.search(r"\{[^{}]*\}", text.split(name)[0]):  # a struct's members are not its type
            text = re.sub(r"\{[^{}]*\}", " ", text, count=1)
        if re.search(r"\bconst\b", text.split(name)[0]) and "*" not in text.split(name)[0].split(
                "const")[-1]:
            continue
        found.append((path, int(line), name))
    return found


def check_globals(files):
    allowed = set()
    for line, cells in table("globals"):
        if len(cells) < 3:
            report(DOC, line, "a globals row needs: file | names | why")
            continue
        for path in code_spans(cells[0]):
            for name in code_spans(cells[1]):
                allowed.add((path, name))
    scope = [f for f in files if f.endswith(".c") and not f.startswith(("tests/", "scripts/",
                                                                          "examples/"))]
    for path, line, name in file_scope_variables(scope):
        if (path, name) not in allowed:
            report(path, line, f"mutable global '{name}': pass it in an object, or list it with "
                               f"its reason in the globals table of {DOC}")


def check_meson():
    for f in tracked("*meson.build"):
        if not f.startswith(("coordinator/", "worker/", "ps/", "common/role/")):
            continue
        for n, text in enumerate(open(os.path.join(ROOT, f)), 1):
            if "declare_dependency" in text:
                block = text
                k = n
                lines = open(os.path.join(ROOT, f)).read().split("\n")
                while ")" not in block and k < len(lines):
                    block += lines[k]
                    k += 1
                if re.search(r"\bcore_dep\b", block):
                    report(f, n, "a role dependency hands the core's internal headers to its "
                                 "users: declare it over core_public_dep")


def main():
    global ROOT
    if len(sys.argv) == 3 and sys.argv[1] == "--root":
        ROOT = os.path.abspath(sys.argv[2])
    files = tracked("*.c", "*.h", "*.cu", "*.cuh")
    check_includes(files)
    check_clock(files)
    check_globals(files)
    check_meson()
    for v in violations:
        print(v)
    if violations:
        print(f"check_layout: {len(violations)} violation(s)")
        return 1
    print(f"check_layout: {len(files)} files: includes follow {DOC}, one clock, no unlisted "
          "globals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
