#!/usr/bin/env bash
# Set up .venv and run the test suite (fast tests, real-vLLM engine tests and the notebooks).
# Extra arguments go to pytest, e.g. `./test.sh -m slow` for the full correctness matrix.
# KIT_TEST_PYTHON=/path/to/python skips the set-up and runs pytest with that interpreter (tests/test_test_sh.py).
set -uo pipefail
cd "$(dirname "$0")"
PY=${KIT_TEST_PYTHON:-.venv/bin/python}
if [ -z "${KIT_TEST_PYTHON:-}" ]; then bash scripts/setup.sh || exit 1; fi
# pytest's own report of the run (JUnit XML) goes to runs/junit/ (KIT_JUNIT_DIR), unless the arguments name one or
# turn the plugin off; `kit test-report --junit FILE --write docs/results/tests.md` renders the results from it.
junit=()
case " $* " in
    *" --junitxml"* | *" --junit-xml"* | *"no:junitxml"*) ;;
    *) junit=(--junitxml "${KIT_JUNIT_DIR:-runs/junit}/$(date -u +%Y%m%dT%H%M%SZ)-$$.xml") ;;
esac
# The 15 slowest tests close the run's output (a CI log keeps only its tail): where its time went.
durations=()
case " $* " in *" --durations"*) ;; *) durations=(--durations=15) ;; esac
KIT_TEST_COMMAND="./test.sh${*:+ $(printf '%q ' "$@" | sed 's/ $//')}" "$PY" -m pytest "$@" ${junit[@]+"${junit[@]}"} \
    ${durations[@]+"${durations[@]}"}
rc=$?
# pytest's 5 means "no tests collected". That is success only for a -m selection whose every marker is one
# pytest knows (e.g. `-m pd` over files without PD tests); a misspelt marker (`-m enigne`) selects nothing too
# and must fail, as must a run with no -m at all.
if [ $rc -eq 5 ]; then
    exprs=()
    prev=""
    for a in "$@"; do
        if [ "$prev" = "-m" ]; then exprs+=("$a"); elif [[ "$a" == -m?* ]]; then exprs+=("${a#-m}"); fi
        prev=$a
    done
    if [ ${#exprs[@]} -eq 0 ]; then echo "test.sh: pytest collected no tests" >&2; exit $rc; fi
    known=" $("$PY" -m pytest --markers -p no:cacheprovider 2>/dev/null \
              | sed -n 's/^@pytest\.mark\.\([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' | tr '\n' ' ') "
    for e in "${exprs[@]}"; do
        for w in $(printf '%s' "$e" | tr -c 'A-Za-z0-9_' ' '); do
            case $w in and|or|not) continue ;; esac
            if [[ "$known" != *" $w "* ]]; then
                echo "test.sh: no tests collected and -m names an unknown marker '$w' (known:$known)" >&2
                exit $rc
            fi
        done
    done
    echo "test.sh: no tests collected for -m ${exprs[*]} (known markers): not a failure"
    exit 0
fi
exit $rc
