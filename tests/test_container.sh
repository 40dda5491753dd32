#!/usr/bin/env bash
# test_container.sh: the container files of dist/ checked without Docker
# (scripts/compose_check.sh runs them for real, by hand, as root):
# 1. dist/Containerfile's package lists name Debian packages (apt-cache
#    show); its build packages are ones scripts/install-deps.sh installs;
#    its runtime packages are no -dev packages and provide every library
#    this binary links (its NEEDED entries, their packages found by dpkg -S;
#    libc6 is in every Debian image);
# 2. what its build stage copies (its COPY lines, at the same paths) holds
#    every file of the source tree that building the binary read here (the
#    compiler's dependency files and the generated sources' inputs);
# 3. dist/compose.yaml: test_container.mjs (its services, their variables
#    against --help, the nodes, the key, the model, the published port).
#
# Usage (CTest passes these): test_container.sh PATH/TO/convoy SOURCE_DIR
# Skips without dpkg, apt-cache, readelf or npm, except under CI=true.
set -uo pipefail

. "$(dirname "$0")/lib.sh"
test_args "$@"
src="$(cd "$src" && pwd)"
convoy="$build/$(basename "$convoy")"
containerfile="$src/dist/Containerfile"

need dpkg
need apt-cache
need readelf "for the binary's libraries"
npm_need "$npm_dir" yaml

# instructions STAGE: the Containerfile's instructions of build stage STAGE
# (1, 2, ...), one a line (continuations joined)
instructions() {
    sed -e ':a' -e '/\\$/{N; s/\\\n//; ba}' "$containerfile" | awk -v want="$1" '/^FROM /{n++} n == want'
}
# packages STAGE: what the stage's apt-get install installs, one a line
packages() {
    instructions "$1" | sed -n 's/.*apt-get install[^&]*--no-install-recommends\([^&]*\).*/\1/p' | tr -s ' ' '\n' |
        grep -v '^$'
}
# among WORD LIST...: WORD is one of LIST
among() {
    local w="$1" x
    shift
    for x in "$@"; do [[ "$x" == "$w" ]] && return 0; done
    return 1
}

# 1. the packages
mapfile -t build_pkgs < <(packages 1)
mapfile -t run_pkgs < <(packages 2)
expect "the build and runtime stages install packages" test ${#build_pkgs[@]} -gt 3 -a ${#run_pkgs[@]} -gt 3
mapfile -t known < <(apt-cache show --no-all-versions "${build_pkgs[@]}" "${run_pkgs[@]}" 2>/dev/null |
    sed -n 's/^Package: //p')
unknown=()
for pkg in "${build_pkgs[@]}" "${run_pkgs[@]}"; do among "$pkg" "${known[@]}" || unknown+=("$pkg"); done
expect "apt-cache knows every package of the Containerfile" test ${#unknown[@]} -eq 0
[[ ${#unknown[@]} -eq 0 ]] || echo "  unknown: ${unknown[*]}"
mapfile -t deps < <(sed -n '/^packages=(/,/)/{s/^packages=(//; s/).*//; p}' "$src/scripts/install-deps.sh" |
    tr -s ' ' '\n')
strays=()
for pkg in "${build_pkgs[@]}"; do among "$pkg" "${deps[@]}" || strays+=("$pkg"); done
expect "its build packages are ones install-deps.sh installs" test ${#strays[@]} -eq 0
[[ ${#strays[@]} -eq 0 ]] || echo "  not in install-deps.sh: ${strays[*]}"
expect "its runtime packages are no -dev packages" bash -c "! printf '%s\n' ${run_pkgs[*]} | grep -q -- '-dev$'"
# the packages of the libraries convoy names (a sanitizer build's runtimes
# are that build's, not the image's), as "PACKAGE:ARCH: PATH" lines
multiarch="$(gcc -print-multiarch 2>/dev/null)"
mapfile -t sonames < <(readelf -d "$convoy" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -v '^lib[a-z]*san\.')
mapfile -t owners < <(dpkg -S "${sonames[@]/#/*/${multiarch:-*}/}" 2>/dev/null)
missing=()
for so in "${sonames[@]}"; do
    pkg="$(printf '%s\n' "${owners[@]}" | grep -m1 "/$so\$" | cut -d: -f1)"
    [[ "$pkg" == libc6 ]] || among "$pkg" "${run_pkgs[@]}" || missing+=("$so (${pkg:-no package})")
done
expect "its runtime packages provide every library convoy links (${#sonames[@]})" \
    test ${#sonames[@]} -gt 3 -a ${#missing[@]} -eq 0
[[ ${#missing[@]} -eq 0 ]] || echo "  not provided: ${missing[*]}"

# 2. the sources the build stage copies: each COPY SRC... DEST puts a
# directory's contents at DEST and a file into DEST/ (all relative to the
# WORKDIR, the source tree's root)
copied=() misplaced=()
while read -r -a args; do
    dest="${args[-1]%/}"
    dest="${dest#.}"
    for s in "${args[@]:1:${#args[@]}-2}"; do
        if [[ -d "$src/$s" ]]; then
            [[ "$dest" == "$s" ]] || misplaced+=("$s")
            copied+=("$s/")
        else
            [[ "${dest:+$dest/}${s##*/}" == "$s" ]] || misplaced+=("$s")
            copied+=("$s")
        fi
    done
done < <(instructions 1 | grep '^COPY ')
expect "the build stage copies files to their own paths" test ${#copied[@]} -gt 0 -a ${#misplaced[@]} -eq 0
[[ ${#misplaced[@]} -eq 0 ]] || echo "  elsewhere: ${misplaced[*]}"
mapfile -t read_files < <(
    cat "$build"/CMakeFiles/convoy_engine.dir/build.make "$build"/CMakeFiles/convoy.dir/build.make \
        $(find "$build/CMakeFiles/convoy_engine.dir" "$build/CMakeFiles/convoy.dir" -name '*.o.d') 2>/dev/null |
        grep -o "$src/[^ :\\\\]*" | grep -v "^$build\(/\|$\)" | sed "s|^$src/||" | sort -u)
uncopied=()
for f in CMakeLists.txt "${read_files[@]}"; do
    hit=""
    for c in "${copied[@]}"; do [[ "$f" == "$c" || ( "$c" == */ && "$f" == "$c"* ) ]] && hit=1; done
    [[ -n "$hit" ]] || uncopied+=("$f")
done
expect "the build stage copies every source file the build read (${#read_files[@]} of them)" \
    test ${#read_files[@]} -gt 50 -a ${#uncopied[@]} -eq 0
[[ ${#uncopied[@]} -eq 0 ]] || echo "  not copied: ${uncopied[*]}"

# 3. the compose file
make_tmp
"$convoy" serve --help >"$tmp/serve.txt" 2>&1
"$convoy" stage --help >"$tmp/stage.txt" 2>&1
cp "$src/tests/test_container.mjs" "$src/tests/checks.mjs" "$npm_dir/"
(cd "$npm_dir" && node test_container.mjs "$src/dist/compose.yaml" "$tmp/serve.txt" "$tmp/stage.txt")
expect "test_container.mjs: the compose file" test $? = 0

checks_summary
