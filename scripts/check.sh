#!/usr/bin/env bash
# Static checks of the tracked C sources, with Debian's tools only (installed if missing):
#   1. clang-format --dry-run -Werror (clang-format 14 and the repository's .clang-format);
#   2. no C file over 1000 lines, unless its head comment (the first 20 lines) gives a reason
#      with the words "over 1000 lines";
#   3. no function over 150 lines (universal-ctags' line: and end: fields), unless the comment
#      just above it (ending on the line before the function) says "flat sequence": a flat
#      "call each step" function;
#   4. the rules of docs/architecture.md (scripts/check_layout.py reads its tables): which module
#      may include which, no MPI/ZeroMQ/CUDA header in a public header, one clock, no mutable
#      global outside the listed ones, role dependencies over the core's public headers.
# Prints each violation as "path:line: what" and exits 1 if there is any.
#   scripts/check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

max_file_lines=1000
max_function_lines=150

missing=()
command -v git >/dev/null || missing+=(git)
command -v clang-format >/dev/null || missing+=(clang-format)
ctags --version 2>/dev/null | grep -q "Universal Ctags" || missing+=(universal-ctags)
[[ -x /usr/bin/python3 ]] || missing+=(python3)
if ((${#missing[@]})); then
    echo "check: installing ${missing[*]}"
    sudo=()
    [[ $(id -u) -ne 0 ]] && sudo=(sudo)
    log=$(mktemp)
    if ! { "${sudo[@]}" apt-get update && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        echo "check: installing ${missing[*]} failed:" >&2
        tail -n 50 "$log" >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
fi

mapfile -t files < <(git ls-files '*.c' '*.h')
violations=0
report() { # path, line, what...
    local path=$1 line=$2
    shift 2
    echo "$path:$line: $*"
    violations=$((violations + 1))
}

# 1. formatting: clang-format names the first line of each region it would change
while IFS= read -r line; do
    if [[ "$line" =~ ^(.+):([0-9]+):[0-9]+:\ (error|warning):\ code\ should\ be\ clang-formatted ]]; then
        report "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" \
            "not clang-formatted (clang-format -i ${BASH_REMATCH[1]})"
    fi
done < <(clang-format --dry-run -Werror "${files[@]}" 2>&1 |
    sed -nE 's/^(.+):([0-9]+):[0-9]+: (error|warning): (code should be clang-formatted).*/\1:\2:0: \3: \4/p' | uniq)

# 2. file length
for f in "${files[@]}"; do
    n=$(wc -l <"$f")
    if ((n > max_file_lines)) && ! head -n 20 "$f" | grep -qi "over 1000 lines"; then
        report "$f" 1 "$n lines (over $max_file_lines) and no reason in its head comment" \
            "(\"over 1000 lines\" in the first 20 lines)"
    fi
done

# 3. function length: ctags gives each function's first line (its name) and its last line
long_functions=$(ctags --c-kinds=f --fields=+ne -f - "${files[@]}" | awk -F'\t' -v max="$max_function_lines" '
    {
        start = 0; end = 0
        for (i = 4; i <= NF; i++) {
            if ($i ~ /^line:/) start = substr($i, 6) + 0
            if ($i ~ /^end:/) end = substr($i, 5) + 0
        }
        if (start > 0 && end >= start && end - start + 1 > max)
            print $2 "\t" start "\t" end - start + 1 "\t" $1
    }' | sort -t$'\t' -k1,1 -k2,2n)
while IFS=$'\t' read -r f start length name; do
    [[ -n "$f" ]] || continue
    # the comment ending on the line before the function: walk up through its lines
    flat=0
    for ((l = start - 1; l >= 1 && l > start - 40; l--)); do
        text=$(sed -n "${l}p" "$f")
        [[ "$text" =~ ^[[:space:]]*(/\*|\*|//) || "$text" =~ \*/[[:space:]]*$ ]] || break
        if grep -qi "flat sequence" <<<"$text"; then
            flat=1
            break
        fi
        [[ "$text" =~ ^[[:space:]]*/\* ]] && break # the comment's first line
    done
    if ((!flat)); then
        report "$f" "$start" "function $name is $length lines (over $max_function_lines) and" \
            "its comment does not call it a \"flat sequence\""
    fi
done <<<"$long_functions"

# 4. the layout rules
if ! /usr/bin/python3 scripts/check_layout.py; then
    violations=$((violations + 1))
fi

if ((violations)); then
    echo "check: $violations violation(s)"
    exit 1
fi
echo "check: ${#files[@]} C files: formatted, none over $max_file_lines lines or with a function" \
    "over $max_function_lines lines"
