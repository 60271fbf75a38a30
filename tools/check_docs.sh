#!/usr/bin/env bash
# tools/check_docs.sh [ROOT]: keeps the design document and the links to it from rotting.
# Fails (exit 1), naming FILE:LINE for each problem, when
#   - docs/design.md's "## N. Title" sections are not numbered 1, 2, 3, ... in order;
#   - any file cites a section of docs/design.md ("docs/design.md §N", "§N and §M") that
#     does not exist, or docs/design.md refers to one of its own sections ("§N") that does
#     not exist;
#   - any file still cites the old design notes that lived outside the repository (the
#     upper-case DESIGN name followed by a section sign, or its .md file name);
#   - a Markdown file has a relative link (or image) to a path that does not exist or that
#     leaves the repository, an absolute link, or an anchor that names no heading;
#   - a Markdown file names a repository path (src/, tests/, tools/, scripts/, configs/,
#     docs/, cmake/) that does not exist.
# Files checked: what git tracks, plus untracked files it does not ignore (without git:
# every file outside .git and build*/). The ctest `docs` runs it on the source tree.
set -euo pipefail
export LC_ALL=C

root=$(cd "${1:-$(dirname "$0")/..}" && pwd -P)
cd "$root"
design=docs/design.md
problems=0
problem() {
  printf '%s:%s: %s\n' "$1" "$2" "$3" >&2
  problems=$((problems + 1))
}

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  while IFS= read -r f; do
    [ -f "$f" ] && files+=("$f")
  done < <(git ls-files --cached --others --exclude-standard)
else
  while IFS= read -r f; do
    files+=("${f#./}")
  done < <(find . -path ./.git -prune -o -path './build*' -prune -o -type f -print)
fi
markdown=()
for f in "${files[@]}"; do
  case "$f" in *.md) markdown+=("$f") ;; esac
done

# Lines of a Markdown file outside fenced code blocks, as "LINE<TAB>TEXT".
outside_fences() {
  awk '/^[ \t]*```/ { fence = !fence; next } !fence { print FNR "\t" $0 }' "$1"
}

# GitHub's anchor of a heading's text (ASCII approximation: lower case; letters, digits,
# spaces, '_' and '-' kept; spaces become '-').
slug() {
  printf '%s' "$1" | tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}
# The anchors of a Markdown file's headings, one a line.
anchors() {
  outside_fences "$1" | while IFS=$'\t' read -r _ text; do
    case "$text" in
      '#'*)
        text=$(printf '%s' "$text" | sed -e 's/^#*[ \t]*//' -e 's/[ \t]*#*[ \t]*$//')
        slug "$text"
        printf '\n'
        ;;
    esac
  done
}

# --- The sections of docs/design.md.
sections=" "
if [ ! -f "$design" ]; then
  problem "$design" 1 "missing: the design document that sources cite"
else
  expected=1
  while IFS=$'\t' read -r line text; do
    case "$text" in
      '## '*) ;;
      *) continue ;;
    esac
    if [[ "$text" =~ ^'## '([0-9]+)'. ' ]]; then
      number=${BASH_REMATCH[1]}
      if [ "$number" != "$expected" ]; then
        problem "$design" "$line" "section numbered $number, expected $expected (numbers are cited: keep them in order, add new sections at the end)"
      fi
      sections+="$number "
      expected=$((number + 1))
    else
      problem "$design" "$line" "a top-level section must be numbered: '## N. Title'"
    fi
  done < <(outside_fences "$design")
fi

# --- Citations of docs/design.md's sections, in every file.
citations=0
check_section() {  # FILE LINE NUMBER WHAT
  citations=$((citations + 1))
  case "$sections" in
    *" $3 "*) ;;
    *) problem "$1" "$2" "$4 §$3, which $design does not have (its sections:${sections% })" ;;
  esac
}
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  text=${rest#*:}
  for n in $(printf '%s' "${text#*design.md}" | grep -oE '[0-9]+'); do
    check_section "$file" "$line" "$n" "cites $design"
  done
done < <(grep -HInoE 'design\.md §[0-9]+((,|, and| and| or) §[0-9]+)*' -- "${files[@]}" || true)
if [ -f "$design" ]; then
  while IFS= read -r hit; do
    check_section "$design" "${hit%%:*}" "${hit#*:§}" "refers to its own"
  done < <(grep -noE '§[0-9]+' "$design" || true)
fi

# --- Citations of the old design notes outside the repository.
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  problem "$file" "${rest%%:*}" "cites the old design notes outside the repository; cite $design §N instead"
done < <(grep -HInE 'DESIGN([[:space:]]*§|\.md)' -- "${files[@]}" || true)

# --- Links and repository paths in Markdown files.
links=0
paths=0
for f in "${markdown[@]}"; do
  dir=$(dirname "$f")
  while IFS=$'\t' read -r line text; do
    while [[ "$text" =~ \]\(([^\)]*)\) ]]; do
      text=${text#*"${BASH_REMATCH[0]}"}
      target=${BASH_REMATCH[1]}
      target=${target%% *}  # drop a title
      target=${target#<}
      target=${target%>}
      case "$target" in
        http://* | https://* | mailto:*) continue ;;
      esac
      links=$((links + 1))
      path=${target%%#*}
      anchor=
      [[ "$target" == *'#'* ]] && anchor=${target#*#}
      linked=$f
      if [ -n "$path" ]; then
        if [[ "$path" == /* ]]; then
          problem "$f" "$line" "link to an absolute path '$path': link relative to the file, inside the repository"
          continue
        fi
        resolved=$(realpath -m -- "$dir/$path")
        if [[ "$resolved" != "$root" && "$resolved" != "$root"/* ]]; then
          problem "$f" "$line" "link '$target' leaves the repository"
          continue
        fi
        if [ ! -e "$resolved" ]; then
          problem "$f" "$line" "link '$target': $path does not exist"
          continue
        fi
        linked=${resolved#"$root"/}
      fi
      # (grep -q would end the pipe early, which pipefail reports as a failure.)
      if [ -n "$anchor" ] && [[ "$linked" == *.md ]] &&
        ! grep -xF -- "$anchor" <<<"$(anchors "$linked")" >/dev/null; then
        problem "$f" "$line" "link '$target': no heading of $linked has the anchor #$anchor"
      fi
    done
  done < <(outside_fences "$f")
  # Repository paths named anywhere in the file (code blocks included); a path ending in a
  # glob or a placeholder (*, ?, [, {, <) is a pattern, not a file.
  while IFS= read -r hit; do
    line=${hit%%:*}
    path=$(printf '%s' "${hit#*:}" | sed -E 's/^[^a-z]//; s/[.]+$//')
    case "$path" in
      *'*' | *'?' | *'[' | *'{' | *'<') continue ;;
    esac
    paths=$((paths + 1))
    [ -e "$path" ] || problem "$f" "$line" "names $path, which does not exist"
  done < <(grep -noE '(^|[^A-Za-z0-9_./-])(src|tests|tools|scripts|configs|docs|cmake)/[A-Za-z0-9_./-]*[*?{<[]?' "$f" || true)
done

if [ "$problems" -gt 0 ]; then
  echo "check_docs: $problems problem(s)" >&2
  exit 1
fi
echo "check_docs: ok ($citations section citations, $links links and $paths repository paths in ${#markdown[@]} Markdown files checked)"
