//! Command-line flags for the examples: `--name VALUE` (or `--name=VALUE`) with defaults,
//! switches, `--help` listing them, and a clear error for anything else. Each example includes
//! it with `#[path = "common/args.rs"] mod args;` (a folder without `main.rs` is not an
//! example of its own).

#![allow(dead_code)] // each example uses part of it

use std::str::FromStr;

/// One flag: its name, the name of its value ("" for a switch), its default ("" for none:
/// then `help` says what happens without it) and what it does.
pub struct Flag {
    pub name: &'static str,
    pub value: &'static str,
    pub default: &'static str,
    pub help: &'static str,
}

/// Shorthand for a `Flag`.
pub const fn flag(
    name: &'static str,
    value: &'static str,
    default: &'static str,
    help: &'static str,
) -> Flag {
    Flag { name, value, default, help }
}

/// The parsed command line.
pub struct Args {
    program: &'static str,
    values: Vec<(&'static str, Option<String>)>,
}

/// Parses the command line against `flags`. `--help` (or `-h`) prints the usage and exits
/// with status 0; an unknown flag or a missing value prints the error and exits with status 2.
pub fn parse(program: &'static str, about: &str, flags: &[Flag]) -> Args {
    let mut out = Args {
        program,
        values: flags
            .iter()
            .map(|f| (f.name, (!f.default.is_empty()).then(|| f.default.to_string())))
            .collect(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            print!("{}", usage(program, about, flags));
            std::process::exit(0);
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let Some(i) = flags.iter().position(|f| f.name == name) else {
            out.fail(&format!("unknown flag {arg:?}"));
        };
        let f = &flags[i];
        out.values[i].1 = Some(if f.value.is_empty() {
            "true".to_string()
        } else {
            inline
                .or_else(|| args.next())
                .unwrap_or_else(|| out.fail(&format!("{name} needs a value: {name} {}", f.value)))
        });
    }
    out
}

fn usage(program: &str, about: &str, flags: &[Flag]) -> String {
    let mut s = format!(
        "{program}: {about}\n\nUsage: cargo run --release --example {program} -- [FLAGS]\n\nFlags:\n"
    );
    let rows: Vec<(String, String)> = flags
        .iter()
        .map(|f| {
            let left =
                if f.value.is_empty() { f.name.to_string() } else { format!("{} {}", f.name, f.value) };
            let right = if f.default.is_empty() {
                f.help.to_string()
            } else {
                format!("{} (default {})", f.help, f.default)
            };
            (left, right)
        })
        .chain([("-h, --help".to_string(), "print this help".to_string())])
        .collect();
    let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    for (l, r) in rows {
        s += &format!("  {l:width$}  {r}\n");
    }
    s
}

impl Args {
    /// The flag's value, or `None` if it has no default and was not given; exits with a clear
    /// error if the value does not parse.
    pub fn get<T: FromStr>(&self, name: &str) -> Option<T> {
        let v = self.values.iter().find(|(n, _)| *n == name).expect("a declared flag").1.as_ref()?;
        Some(v.parse().unwrap_or_else(|_| self.fail(&format!("{name}: cannot read {v:?}"))))
    }

    /// The value of a flag that has a default.
    pub fn value<T: FromStr>(&self, name: &str) -> T {
        self.get(name).expect("a flag with a default")
    }

    /// A number that must be at least 1 (or `None` if it has no default and was not given).
    pub fn positive(&self, name: &str) -> Option<usize> {
        let n = self.get::<usize>(name)?;
        if n == 0 {
            self.fail(&format!("{name} must be at least 1"));
        }
        Some(n)
    }

    /// Whether a switch was given.
    pub fn switch(&self, name: &str) -> bool {
        self.get::<bool>(name).unwrap_or(false)
    }

    /// Reports a usage error on stderr and exits with status 2.
    pub fn fail(&self, message: &str) -> ! {
        eprintln!("{}: {message} (--help lists the flags)", self.program);
        std::process::exit(2)
    }
}
