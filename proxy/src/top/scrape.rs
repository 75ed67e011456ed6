//! What `sidecache top` reads: one blocking HTTP/1.1 GET of the metrics
//! endpoint's `/metrics` (parsed from the Prometheus text format into
//! [`Metrics`]) and `/debug/hotkeys` (its JSON, into [`HotKey`]s). No
//! figure is computed here; [`super::view`] turns two samples into rates.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use serde::Deserialize;

/// Largest response read (a /metrics page is tens of kilobytes).
const MAX_BODY: usize = 16 << 20;

/// One label set: `(name, value)` pairs in the order the page gave them.
pub type Labels = Vec<(String, String)>;

/// Every series of one /metrics page, by metric name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    series: BTreeMap<String, Vec<(Labels, f64)>>,
}

impl Metrics {
    /// Parses the Prometheus text format (comments skipped; a line that
    /// does not parse is an error naming it).
    ///
    /// # Errors
    /// A malformed sample line.
    pub fn parse(text: &str) -> anyhow::Result<Metrics> {
        let mut series: BTreeMap<String, Vec<(Labels, f64)>> = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, labels, value) =
                parse_line(line).ok_or_else(|| anyhow!("bad metrics line: {line:?}"))?;
            series
                .entry(name.to_owned())
                .or_default()
                .push((labels, value));
        }
        Ok(Metrics { series })
    }

    /// The series of `name` with exactly no labels, or the one whose
    /// labels include every pair of `with`.
    pub fn get(&self, name: &str, with: &[(&str, &str)]) -> Option<f64> {
        self.series.get(name)?.iter().find_map(|(labels, v)| {
            let all = with
                .iter()
                .all(|(k, want)| labels.iter().any(|(n, got)| n == k && got == want));
            (all && (!with.is_empty() || labels.is_empty())).then_some(*v)
        })
    }

    /// The sum of every series of `name` (0 when absent).
    pub fn sum(&self, name: &str) -> f64 {
        self.series
            .get(name)
            .map_or(0.0, |s| s.iter().map(|(_, v)| v).sum())
    }

    /// Every series of `name` by the value of its label `label`.
    pub fn by_label(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        let Some(s) = self.series.get(name) else {
            return Vec::new();
        };
        s.iter()
            .filter_map(|(labels, v)| {
                let l = labels.iter().find(|(n, _)| n == label)?;
                Some((l.1.clone(), *v))
            })
            .collect()
    }

    /// The value of label `label` on the first series of `name`.
    pub fn label(&self, name: &str, label: &str) -> Option<String> {
        self.by_label(name, label)
            .into_iter()
            .next()
            .map(|(l, _)| l)
    }
}

/// `name{a="x",b="y"} value [timestamp]` or `name value [timestamp]`.
fn parse_line(line: &str) -> Option<(&str, Labels, f64)> {
    let name_end = line.find(['{', ' ', '\t'])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Labels::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find('=')?;
            let key = rest[..eq].trim().to_owned();
            rest = rest[eq + 1..].trim_start().strip_prefix('"')?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            rest = &rest[end + 1..];
            labels.push((key, value));
        }
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some((name, labels, value))
}

/// One key of the hot-key ranking, as `/debug/hotkeys` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HotKey {
    /// Its database.
    pub db: u16,
    /// The key, escaped (`\xNN` for bytes that are not printable UTF-8).
    pub key: String,
    /// Estimated reads.
    pub count: u64,
}

/// The body of `/debug/hotkeys`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HotKeys {
    /// The ranking (`reads`).
    pub by: String,
    /// One event in `sample` is counted (`--hotkeys-sample`).
    pub sample: u32,
    /// Most read first.
    pub keys: Vec<HotKey>,
}

/// One scrape: the metrics, and the hot keys or why there are none.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the scrape finished.
    pub at: Instant,
    /// The /metrics page.
    pub metrics: Metrics,
    /// The hot keys by reads, or the endpoint's one-line reason (e.g. hot
    /// keys off).
    pub hotkeys: Result<HotKeys, String>,
}

/// Reads `/metrics` and `/debug/hotkeys?by=reads&n=N` from `addr`.
///
/// # Errors
/// Connection failures, timeouts and a /metrics that is not 200 or does
/// not parse (a hot-key failure is kept in the sample instead).
pub fn sample(addr: &str, n: usize, timeout: Duration) -> anyhow::Result<Sample> {
    let (status, body) = get(addr, "/metrics", timeout)?;
    if status != 200 {
        bail!("/metrics answered {status}: {}", body.trim());
    }
    let metrics = Metrics::parse(&body)?;
    let hotkeys = match get(addr, &format!("/debug/hotkeys?by=reads&n={n}"), timeout)? {
        (200, body) => serde_json::from_str::<HotKeys>(&body)
            .map_err(|e| format!("bad /debug/hotkeys answer: {e}")),
        (status, body) => Err(format!("{status}: {}", body.trim())),
    };
    Ok(Sample {
        at: Instant::now(),
        metrics,
        hotkeys,
    })
}

/// One HTTP/1.1 GET with `Connection: close`: (status, body).
fn get(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    let target = addr
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {addr}"))?
        .next()
        .ok_or_else(|| anyhow!("cannot resolve {addr}"))?;
    let mut s = TcpStream::connect_timeout(&target, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.take(MAX_BODY as u64 + 1)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading {path} from {addr}"))?;
    if raw.len() > MAX_BODY {
        bail!("{path}: answer over {MAX_BODY} bytes");
    }
    parse_response(&raw).with_context(|| format!("{path} from {addr}"))
}

/// Status and body of a whole `Connection: close` response (the body ends
/// at `Content-Length`, or at the end of the stream).
fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, String)> {
    let head_end = memchr::memmem::find(raw, b"\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP header in the answer"))?;
    let head = std::str::from_utf8(&raw[..head_end]).context("HTTP header not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| anyhow!("bad HTTP status line"))?;
    let mut body = &raw[head_end + 4..];
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        if k.trim().eq_ignore_ascii_case("content-length") {
            let len: usize = v.trim().parse().context("bad Content-Length")?;
            if len > body.len() {
                bail!("answer cut short");
            }
            body = &body[..len];
        } else if k.trim().eq_ignore_ascii_case("transfer-encoding") {
            bail!("unexpected Transfer-Encoding: {}", v.trim());
        }
    }
    Ok((status, String::from_utf8_lossy(body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_text_format() {
        let m = Metrics::parse(
            "# HELP a x\n# TYPE a counter\na 3\nb{shard=\"127.0.0.1:7000\",k=\"q\\\"x\\\\y\"} 1.5\nb{shard=\"h:2\"} 2\nc_bucket{le=\"+Inf\"} 7\nd +Inf\n",
        )
        .expect("parses");
        assert_eq!(m.get("a", &[]), Some(3.0));
        assert_eq!(m.get("b", &[]), None);
        assert_eq!(m.get("b", &[("shard", "h:2")]), Some(2.0));
        assert_eq!(m.get("b", &[("k", "q\"x\\y")]), Some(1.5));
        assert_eq!(m.sum("b"), 3.5);
        assert_eq!(m.sum("missing"), 0.0);
        assert_eq!(
            m.by_label("b", "shard"),
            vec![("127.0.0.1:7000".to_owned(), 1.5), ("h:2".to_owned(), 2.0)]
        );
        assert_eq!(m.get("c_bucket", &[("le", "+Inf")]), Some(7.0));
        assert_eq!(m.get("d", &[]), Some(f64::INFINITY));
        assert!(Metrics::parse("a{b=\"c} 1\n").is_err());
        assert!(Metrics::parse("a x\n").is_err());
    }

    #[test]
    fn parses_responses() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabcdef";
        assert_eq!(parse_response(r).expect("ok"), (200, "abc".to_owned()));
        let r = b"HTTP/1.1 404 Not Found\r\n\r\nhot keys are off\n";
        assert_eq!(
            parse_response(r).expect("ok"),
            (404, "hot keys are off\n".to_owned())
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nab").is_err());
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn parses_hotkeys_json() {
        let h: HotKeys = serde_json::from_str(
            r#"{"by":"reads","sample":32,"keys":[{"db":0,"key":"user:1","count":4096},{"db":3,"key":"a\\x00\"b","count":32}]}"#,
        )
        .expect("parses");
        assert_eq!(h.sample, 32);
        assert_eq!(h.keys[1].key, "a\\x00\"b");
        assert_eq!(h.keys[1].db, 3);
    }
}
