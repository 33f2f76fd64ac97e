#!/usr/bin/env bash
# Prepares the two training splits of a many-runs audit around one target record:
#
#   scripts/slurm/target-splits.sh SPLIT.toml TARGET DIR
#
# TARGET must be a non-member row of SPLIT.toml. Writes DIR/split-out.toml (SPLIT unchanged: the
# target is a non-member, not trained on) and DIR/split-in.toml (the target moved from the
# non-members to the members), each with its list hashes recomputed, so that `dpaudit train
# --split DIR/split-{in,out}.toml` trains with or without the target and `dpaudit mia` on the
# result scores the target as a member or as a non-member. Exit 2 (naming the file) on bad input.
set -euo pipefail
fail() { echo "target-splits.sh: $*" >&2; exit 2; }
[ $# -eq 3 ] || fail "usage: target-splits.sh SPLIT.toml TARGET DIR"
split=$1 target=$2 dir=$3
[ -f "$split" ] || fail "$split: no such file"
case "$target" in '' | *[!0-9]*) fail "TARGET=$target must be a row index (0, 1, …)" ;; esac
target=$((10#$target))
list() { # the comma-separated indices of the list named $1 (one line `name = [a, b, …]`)
  sed -n "s/^$1 = \[\(.*\)\]\$/\1/p" "$split" | tr -d ' '
}
members=$(list members)
nonmembers=$(list nonmembers)
[ -n "$members" ] && [ -n "$nonmembers" ] ||
  fail "$split: no one-line \`members = […]\` and \`nonmembers = […]\` lists (a dpaudit split manifest?)"
grep -qx "$target" <(tr ',' '\n' <<<"$nonmembers") ||
  fail "$split: row $target is not a non-member (the target must be a non-member of the split)"
sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
[ "$(sha "$members")" = "$(sed -n 's/^members_sha256 = "\(.*\)"$/\1/p' "$split")" ] ||
  fail "$split: members_sha256 does not match the members list"
in_members=$(tr ',' '\n' <<<"$members,$target" | sort -n | paste -sd,)
in_nonmembers=$(tr ',' '\n' <<<"$nonmembers" | grep -vx "$target" | paste -sd,)
[ -n "$in_nonmembers" ] || fail "$split: the target is the only non-member"
mkdir -p "$dir"
cp "$split" "$dir/split-out.toml.tmp" && mv "$dir/split-out.toml.tmp" "$dir/split-out.toml"
spaced() { sed 's/,/, /g' <<<"$1"; }
{
  echo "# $split with row $target moved from the non-members to the members (scripts/slurm/target-splits.sh)."
  while IFS= read -r line; do
    case "$line" in
      'members = ['*) echo "members = [$(spaced "$in_members")]" ;;
      'nonmembers = ['*) echo "nonmembers = [$(spaced "$in_nonmembers")]" ;;
      'members_sha256 = '*) echo "members_sha256 = \"$(sha "$in_members")\"" ;;
      'nonmembers_sha256 = '*) echo "nonmembers_sha256 = \"$(sha "$in_nonmembers")\"" ;;
      *) printf '%s\n' "$line" ;;
    esac
  done <"$split"
} >"$dir/split-in.toml.tmp"
mv "$dir/split-in.toml.tmp" "$dir/split-in.toml"
echo "target row $target: $dir/split-in.toml (member), $dir/split-out.toml (non-member)"
