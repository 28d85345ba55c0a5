//! Every command's exit statuses: 0 when it did what was asked, 2 when
//! kloop could not run it (a usage or setup error, from `main.rs`), and
//! these. docs/usage.md's table is written from here (`cargo xtask docs`);
//! the docs test (`xtask/src/docs_generated.rs`) holds each command's file
//! to it: every status it returns by number is listed.

/// The status of a run whose kernel did not build.
pub(crate) const EXIT_BUILD: u8 = 3;

/// Per command (clap's name), its statuses other than 0 and 2.
pub(crate) const EXIT_STATUSES: &[(&str, &[(u8, &str)])] = &[
    (
        "vm-test",
        &[(
            1,
            "a trial failed (FAILED, FIXED?, INFRA, TIMEOUT, PANIC, INTERRUPTED, FLAKY), or every \
             trial was SKIPPED (`--allow-skipped` accepts that); with `--baseline`: the A/B is \
             not accepted",
        )],
    ),
    ("bless", &[(1, "as `vm-test`")]),
    ("bench", &[]),
    (
        "validate",
        &[
            (
                1,
                "not accepted: a change or breakage the expected fixes do not explain, a blind \
                 check, or the run interrupted",
            ),
            (EXIT_BUILD, "a kernel did not build"),
        ],
    ),
    ("bisect", &[]),
    (
        "bisect-step",
        &[
            (1, "the commit is new"),
            (125, "skip: it did not build, or its runs did not agree"),
            (128, "the step could not run at all: `git bisect run` stops"),
        ],
    ),
    ("check-perf-data", &[(1, "findings no known bug explains")]),
    (
        "clean",
        &[(1, "something could not be removed, or the cache is in use")],
    ),
    ("docs", &[(1, "`--check`: a generated section is stale")]),
    ("doctor", &[(1, "a check FAILs")]),
    (
        "kernels",
        &[
            (1, "`build --checks`: a check's control did not fire"),
            (EXIT_BUILD, "`build`: the kernel did not build"),
        ],
    ),
    ("merge", &[(1, "as `vm-test`, over the joined shards")]),
    (
        "mutants",
        &[
            (1, "a survivor has no note in `kernels/mutation-notes.toml`"),
            (
                130,
                "interrupted: the report holds the mutants judged so far",
            ),
        ],
    ),
    (
        "repro",
        &[
            (
                1,
                "`--prove`: the reproducer does not answer as the ledger and the fix say on \
                 every kernel",
            ),
            (
                EXIT_BUILD,
                "`--prove`: a kernel to prove it on did not build",
            ),
        ],
    ),
    (
        "audit",
        &[(
            1,
            "a series was left unanswered for a reason other than the mirror",
        )],
    ),
    ("report-bug", &[]),
    (
        "skips",
        &[(
            1,
            "`kernels/expected-skips.toml` differs from the derived list",
        )],
    ),
    (
        "vm-shell",
        &[(
            1,
            "the guest kernel panicked, the shell did not come up within the boot deadline, or \
             QEMU ended before it",
        )],
    ),
];

/// docs/usage.md's table of exit statuses.
pub(crate) fn table() -> String {
    let mut out = String::from("| command | status | when |\n|---|---|---|\n");
    for (command, statuses) in EXIT_STATUSES {
        for (code, when) in *statuses {
            out.push_str(&format!("| `{command}` | {code} | {when} |\n"));
        }
    }
    out
}

/// The sections the xtask adds to `kloop::session::docs`'s.
pub(crate) fn sections() -> Vec<kloop::session::docs::Section> {
    vec![kloop::session::docs::Section {
        file: "docs/usage.md",
        name: "exit-statuses",
        body: table(),
    }]
}
