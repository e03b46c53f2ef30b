//! Driver for the system `tshark` (Wireshark's command-line dissector).
//!
//! Every run uses the base options
//! `-n -o tcp.try_heuristic_first:TRUE --disable-heuristic rpcrdma_iwarp`:
//! MPA is found only by heuristic (it has no port of its own), so the
//! heuristic must run before any dissector registered on the port, and the
//! RPC-over-RDMA heuristic would otherwise claim Send payloads and mark them
//! malformed. They are followed by any [`with_option`](Tshark::with_option) preferences and
//! [`with_lua`](Tshark::with_lua) scripts, then the capture and the
//! helper's own arguments.
//!
//! Captures are given as a [`Capture`]: a file path, or pcap bytes in memory
//! (fed to `tshark -r -` on standard input).
//!
//! tshark's standard error is captured. It is ignored when tshark succeeds
//! (as root it always says "Running as user root ... could be dangerous");
//! a non-zero exit status is an [`Error::Failed`] that includes it.
//!
//! Tests that need tshark should start with [`Tshark::for_test`], which
//! fails the test with installation instructions when tshark is missing,
//! unless `SOFTRDMA_SKIP_TSHARK=1` is set.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// The options every run starts with (see the module docs).
pub const BASE_ARGS: [&str; 5] = [
    "-n",
    "-o",
    "tcp.try_heuristic_first:TRUE",
    "--disable-heuristic",
    "rpcrdma_iwarp",
];

/// Environment variable that turns a missing tshark into a skipped test
/// (value `1`) instead of a failure.
pub const SKIP_ENV: &str = "SOFTRDMA_SKIP_TSHARK";

/// Numeric value of Wireshark's Error severity (`PI_ERROR`) as shown in the
/// `_ws.expert.severity` field.
pub const SEVERITY_ERROR: u32 = 0x0080_0000;

/// What to tell someone whose machine has no tshark.
const INSTALL_HINT: &str =
    "tshark not found on PATH; install it with scripts/install-test-deps.sh \
     (run as root, or as a user with sudo)";

/// A packet capture to dissect: a file, or pcap bytes in memory.
#[derive(Clone, Copy, Debug)]
pub enum Capture<'a> {
    /// A pcap/pcapng file on disk.
    File(&'a Path),
    /// A whole pcap stream in memory, piped to tshark's standard input.
    Bytes(&'a [u8]),
}

impl<'a> From<&'a Path> for Capture<'a> {
    fn from(p: &'a Path) -> Self {
        Capture::File(p)
    }
}

impl<'a> From<&'a PathBuf> for Capture<'a> {
    fn from(p: &'a PathBuf) -> Self {
        Capture::File(p)
    }
}

impl<'a> From<&'a str> for Capture<'a> {
    fn from(p: &'a str) -> Self {
        Capture::File(Path::new(p))
    }
}

impl<'a> From<&'a [u8]> for Capture<'a> {
    fn from(b: &'a [u8]) -> Self {
        Capture::Bytes(b)
    }
}

impl<'a> From<&'a Vec<u8>> for Capture<'a> {
    fn from(b: &'a Vec<u8>) -> Self {
        Capture::Bytes(b)
    }
}

/// Errors from running tshark.
#[derive(Debug)]
pub enum Error {
    /// tshark could not be started, or its pipes failed.
    Io {
        /// The command line.
        command: String,
        /// The underlying error.
        source: io::Error,
    },
    /// tshark exited unsuccessfully.
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// Everything it wrote to standard error.
        stderr: String,
    },
    /// tshark's output was not what the helper expected.
    Output {
        /// The command line.
        command: String,
        /// What was wrong.
        message: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { command, source } => write!(f, "running `{command}`: {source}"),
            Error::Failed {
                command,
                status,
                stderr,
            } => write!(
                f,
                "`{command}` failed ({status}); stderr:\n{}",
                stderr.trim_end()
            ),
            Error::Output { command, message } => {
                write!(f, "unexpected output from `{command}`: {message}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// One `iwarp_mpa.crc_check` item: an MPA CRC that tshark verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrcCheck {
    /// Frame number (1-based) in which the FPDU was dissected.
    pub frame: u64,
    /// The transmitted CRC as tshark shows it (wire octets read big-endian).
    pub value: String,
    /// `true` for "Good CRC32", `false` for "Bad CRC32".
    pub good: bool,
    /// tshark's full label, e.g. `CRC check: 0x... (Bad CRC32, should be 0x...)`.
    pub label: String,
}

/// A configured tshark command.
#[derive(Clone, Debug)]
pub struct Tshark {
    program: PathBuf,
    prefs: Vec<(String, String)>,
    lua: Vec<(PathBuf, Vec<String>)>,
}

impl Tshark {
    /// Finds `tshark` on `PATH`.
    ///
    /// The error message tells how to install it
    /// (`scripts/install-test-deps.sh`).
    pub fn find() -> Result<Tshark, String> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        for dir in std::env::split_paths(&path) {
            if dir.as_os_str().is_empty() {
                continue;
            }
            let candidate = dir.join("tshark");
            if is_executable(&candidate) {
                return Ok(Tshark::at(candidate));
            }
        }
        Err(INSTALL_HINT.to_string())
    }

    /// Uses the tshark binary at `program`.
    pub fn at(program: impl Into<PathBuf>) -> Tshark {
        Tshark {
            program: program.into(),
            prefs: Vec::new(),
            lua: Vec::new(),
        }
    }

    /// For tests: [`find`](Self::find) tshark, or decide what a test without it
    /// does.
    ///
    /// Returns `Some` when tshark is found. When it is missing and
    /// `SOFTRDMA_SKIP_TSHARK=1` is set, prints `<test>: SKIPPED ...` on standard
    /// error (bypassing the test harness's output capture) and returns `None`;
    /// the test should then return early. Otherwise it panics with the
    /// installation hint, so a missing tshark fails the test suite.
    ///
    /// ```no_run
    /// # fn t() {
    /// let Some(ts) = softrdma_sim::tshark::Tshark::for_test("my_test") else {
    ///     return;
    /// };
    /// # }
    /// ```
    pub fn for_test(test_name: &str) -> Option<Tshark> {
        match Tshark::find() {
            Ok(t) => Some(t),
            Err(msg) => {
                if std::env::var_os(SKIP_ENV).is_some_and(|v| v == "1") {
                    let _ = writeln!(
                        io::stderr(),
                        "{test_name}: SKIPPED ({msg}; {SKIP_ENV}=1 is set)"
                    );
                    None
                } else {
                    panic!("{test_name}: {msg}. (Set {SKIP_ENV}=1 to skip tshark tests instead.)");
                }
            }
        }
    }

    /// Path of the tshark binary.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Adds a preference, passed as `-o name:value` after the base options.
    pub fn with_option(mut self, name: &str, value: &str) -> Tshark {
        self.prefs.push((name.to_string(), value.to_string()));
        self
    }

    /// Turns on IPv4, TCP and UDP checksum validation, so bad checksums are
    /// shown as such and raise Error-level expert items.
    pub fn with_checksum_validation(self) -> Tshark {
        self.with_option("ip.check_checksum", "TRUE")
            .with_option("tcp.check_checksum", "TRUE")
            .with_option("udp.check_checksum", "TRUE")
    }

    /// Loads a Lua script (`-X lua_script:FILE`).
    pub fn with_lua(mut self, script: impl Into<PathBuf>) -> Tshark {
        self.lua.push((script.into(), Vec::new()));
        self
    }

    /// Passes `arg` to the most recently added Lua script
    /// (`-X lua_scriptN:ARG`); the script sees it in `...`.
    ///
    /// # Panics
    ///
    /// Panics if no script was added with [`with_lua`](Self::with_lua).
    pub fn with_lua_arg(mut self, arg: &str) -> Tshark {
        let (_, args) = self
            .lua
            .last_mut()
            .expect("with_lua_arg needs a script added by with_lua first");
        args.push(arg.to_string());
        self
    }

    /// The arguments before `-r`: base options, preferences, Lua scripts.
    fn leading_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = BASE_ARGS.iter().map(OsString::from).collect();
        for (name, value) in &self.prefs {
            args.push("-o".into());
            args.push(format!("{name}:{value}").into());
        }
        for (n, (script, script_args)) in self.lua.iter().enumerate() {
            let mut x = OsString::from("lua_script:");
            x.push(script.as_os_str());
            args.push("-X".into());
            args.push(x);
            for a in script_args {
                args.push("-X".into());
                args.push(format!("lua_script{}:{a}", n + 1).into());
            }
        }
        args
    }

    /// Runs `tshark <base options> -r CAPTURE <args>` and returns its
    /// standard output.
    pub fn run<'a>(&self, capture: impl Into<Capture<'a>>, args: &[&str]) -> Result<String, Error> {
        let capture = capture.into();
        let mut all = self.leading_args();
        all.push("-r".into());
        match capture {
            Capture::File(p) => all.push(p.as_os_str().to_os_string()),
            Capture::Bytes(_) => all.push("-".into()),
        }
        all.extend(args.iter().map(OsString::from));
        let stdin = match capture {
            Capture::File(_) => None,
            Capture::Bytes(b) => Some(b),
        };
        self.exec(&all, stdin)
    }

    /// Runs tshark with exactly `args` (no base options, no capture) and
    /// returns its standard output.
    pub fn run_raw(&self, args: &[&str]) -> Result<String, Error> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        self.exec(&args, None)
    }

    fn exec(&self, args: &[OsString], stdin: Option<&[u8]>) -> Result<String, Error> {
        let command = command_line(&self.program, args);
        let io_err = |source| Error::Io {
            command: command.clone(),
            source,
        };
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err)?;

        let mut child_in = child.stdin.take();
        let mut child_out = child.stdout.take().expect("stdout is piped");
        let mut child_err = child.stderr.take().expect("stderr is piped");
        let (out, err, fed) = std::thread::scope(|s| {
            let feeder = s.spawn(move || -> io::Result<()> {
                if let (Some(pipe), Some(bytes)) = (child_in.as_mut(), stdin) {
                    match pipe.write_all(bytes) {
                        // tshark may stop reading early (e.g. on a bad file);
                        // its exit status tells what happened.
                        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                        other => other?,
                    }
                }
                drop(child_in);
                Ok(())
            });
            let err_reader = s.spawn(move || {
                let mut buf = Vec::new();
                child_err.read_to_end(&mut buf).map(|_| buf)
            });
            let mut out = Vec::new();
            let out_res = child_out.read_to_end(&mut out).map(|_| out);
            let err = err_reader.join().expect("stderr reader panicked");
            let fed = feeder.join().expect("stdin feeder panicked");
            (out_res, err, fed)
        });
        let status = child.wait().map_err(io_err)?;
        let out = out.map_err(io_err)?;
        let err = err.map_err(io_err)?;
        let stderr = String::from_utf8_lossy(&err).into_owned();
        if !status.success() {
            return Err(Error::Failed {
                command,
                status,
                stderr,
            });
        }
        fed.map_err(io_err)?;
        String::from_utf8(out).map_err(|e| Error::Output {
            command,
            message: format!("standard output is not UTF-8: {e}"),
        })
    }

    fn output_error(&self, args: &[&str], message: String) -> Error {
        let mut all = self.leading_args();
        all.extend(args.iter().map(OsString::from));
        Error::Output {
            command: command_line(&self.program, &all),
            message,
        }
    }

    /// `tshark -v` first line, e.g. `TShark (Wireshark) 4.0.17 (...)`.
    pub fn version(&self) -> Result<String, Error> {
        let out = self.run_raw(&["-v"])?;
        Ok(out.lines().next().unwrap_or_default().to_string())
    }

    /// The one-line-per-packet summary.
    pub fn summary<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<String, Error> {
        self.run(capture, &[])
    }

    /// The full packet details (`-V`).
    pub fn verbose<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<String, Error> {
        self.run(capture, &["-V"])
    }

    /// The packet details as PDML XML (`-T pdml`).
    pub fn pdml<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<String, Error> {
        self.run(capture, &["-T", "pdml"])
    }

    /// Field values, one row per packet matching `display_filter` (all
    /// packets if it is empty), one column per name in `fields`.
    ///
    /// Runs `-T fields -E occurrence=a -E aggregator='|' -E separator=/t`:
    /// a field that occurs several times in a packet gives its values joined
    /// by `|`, and a field that is absent gives an empty string.
    pub fn fields<'a>(
        &self,
        capture: impl Into<Capture<'a>>,
        display_filter: &str,
        fields: &[&str],
    ) -> Result<Vec<Vec<String>>, Error> {
        if fields.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec![
            "-T",
            "fields",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=|",
            "-E",
            "separator=/t",
        ];
        if !display_filter.is_empty() {
            args.push("-Y");
            args.push(display_filter);
        }
        for f in fields {
            args.push("-e");
            args.push(f);
        }
        let out = self.run(capture, &args)?;
        let mut rows = Vec::new();
        for line in out.lines() {
            let row: Vec<String> = line.split('\t').map(str::to_string).collect();
            if row.len() != fields.len() {
                return Err(self.output_error(
                    &args,
                    format!(
                        "expected {} tab-separated columns, got {}: {line:?}",
                        fields.len(),
                        row.len()
                    ),
                ));
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// All values of one field across the capture, flattened (multiple
    /// occurrences in a packet are split on `|`; absent fields are skipped).
    pub fn field_values<'a>(
        &self,
        capture: impl Into<Capture<'a>>,
        display_filter: &str,
        field: &str,
    ) -> Result<Vec<String>, Error> {
        let rows = self.fields(capture, display_filter, &[field])?;
        Ok(rows
            .into_iter()
            .filter(|r| !r[0].is_empty())
            .flat_map(|r| r[0].split('|').map(str::to_string).collect::<Vec<_>>())
            .collect())
    }

    /// Number of expert items of Error severity (bad checksums when
    /// validation is on, malformed packets, Lua `expert.severity.ERROR`, ...).
    ///
    /// Counts the `_ws.expert.severity` values equal to [`SEVERITY_ERROR`],
    /// the same items `-z expert,error` lists.
    pub fn expert_errors<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<usize, Error> {
        let error = SEVERITY_ERROR.to_string();
        let values = self.field_values(capture, "", "_ws.expert.severity")?;
        Ok(values.iter().filter(|v| **v == error).count())
    }

    /// The text of `-q -z expert,error` (empty when there are no errors),
    /// for diagnostics.
    pub fn expert_error_report<'a>(
        &self,
        capture: impl Into<Capture<'a>>,
    ) -> Result<String, Error> {
        let out = self.run(capture, &["-q", "-z", "expert,error"])?;
        Ok(out.trim().to_string())
    }

    /// Number of frames that contain a `_ws.malformed` item.
    pub fn malformed_count<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<usize, Error> {
        let rows = self.fields(capture, "_ws.malformed", &["frame.number"])?;
        Ok(rows.len())
    }

    /// Every MPA CRC verdict (`iwarp_mpa.crc_check`), read from PDML.
    ///
    /// The verdict exists only in the label text ("Good CRC32" / "Bad
    /// CRC32"). CRCs of connections that negotiated no CRC
    /// appear as `iwarp_mpa.crc` instead and are not listed.
    pub fn crc_checks<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<Vec<CrcCheck>, Error> {
        let pdml = self.pdml(capture)?;
        let mut checks = Vec::new();
        let mut frame: u64 = 0;
        for line in pdml.lines() {
            let line = line.trim_start();
            if !line.starts_with("<field ") {
                continue;
            }
            let Some(name) = xml_attr(line, "name") else {
                continue;
            };
            if name == "num" || name == "frame.number" {
                if let Some(n) = xml_attr(line, "show").and_then(|s| s.parse().ok()) {
                    frame = n;
                }
            } else if name == "iwarp_mpa.crc_check" {
                let label = xml_attr(line, "showname").unwrap_or_default();
                let good = if label.contains("Good CRC32") {
                    true
                } else if label.contains("Bad CRC32") {
                    false
                } else {
                    return Err(self.output_error(
                        &["-T", "pdml"],
                        format!("frame {frame}: CRC label without a verdict: {label:?}"),
                    ));
                };
                checks.push(CrcCheck {
                    frame,
                    value: xml_attr(line, "show").unwrap_or_default(),
                    good,
                    label,
                });
            }
        }
        Ok(checks)
    }

    /// Number of MPA CRCs tshark labels "Good CRC32".
    pub fn count_good_crc<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<usize, Error> {
        Ok(self.crc_checks(capture)?.iter().filter(|c| c.good).count())
    }

    /// Number of MPA CRCs tshark labels "Bad CRC32".
    pub fn count_bad_crc<'a>(&self, capture: impl Into<Capture<'a>>) -> Result<usize, Error> {
        Ok(self.crc_checks(capture)?.iter().filter(|c| !c.good).count())
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) => m.is_file() && m.permissions().mode() & 0o111 != 0,
        Err(_) => false,
    }
}

fn command_line(program: &Path, args: &[OsString]) -> String {
    let mut s = program.display().to_string();
    for a in args {
        s.push(' ');
        s.push_str(&shell_quote(a));
    }
    s
}

fn shell_quote(arg: &OsStr) -> String {
    let a = arg.to_string_lossy();
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:/=+@%".contains(c));
    if plain {
        a.into_owned()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// Value of attribute `name` in one XML start tag (PDML puts each element
/// on its own line), with the predefined entities and character references
/// decoded.
fn xml_attr(tag: &str, name: &str) -> Option<String> {
    let needle = format!(" {name}=\"");
    let start = tag.find(&needle)? + needle.len();
    let len = tag[start..].find('"')?;
    Some(xml_unescape(&tag[start..start + len]))
}

fn xml_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(semi) = rest.find(';') else {
            break;
        };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_attributes() {
        let tag = r#"<field name="iwarp_mpa.crc_check" showname="CRC check: 0x1 (Good CRC32) &quot;x&quot; &amp; &#x41;&#66;" size="4" show="0x1"/>"#;
        assert_eq!(xml_attr(tag, "name").unwrap(), "iwarp_mpa.crc_check");
        assert_eq!(
            xml_attr(tag, "showname").unwrap(),
            "CRC check: 0x1 (Good CRC32) \"x\" & AB"
        );
        assert_eq!(xml_attr(tag, "show").unwrap(), "0x1");
        assert_eq!(xml_attr(tag, "missing"), None);
        assert_eq!(xml_unescape("a &bogus; b & c"), "a &bogus; b & c");
    }

    #[test]
    fn leading_args_order() {
        let t = Tshark::at("/x/tshark")
            .with_option("udp.check_checksum", "TRUE")
            .with_lua("/a.lua")
            .with_lua_arg("port=9")
            .with_lua("/b.lua");
        let args: Vec<String> = t
            .leading_args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "-n",
                "-o",
                "tcp.try_heuristic_first:TRUE",
                "--disable-heuristic",
                "rpcrdma_iwarp",
                "-o",
                "udp.check_checksum:TRUE",
                "-X",
                "lua_script:/a.lua",
                "-X",
                "lua_script1:port=9",
                "-X",
                "lua_script:/b.lua",
            ]
        );
    }

    #[test]
    fn quoting() {
        let args: Vec<OsString> = vec!["-Y".into(), "a || b".into(), "it's".into()];
        assert_eq!(
            command_line(Path::new("tshark"), &args),
            r#"tshark -Y 'a || b' 'it'\''s'"#
        );
    }
}
