//! Who may use the page. It starts labs as root on this machine, so every request must:
//! - come to a Host this server is: `localhost` or an IP address of its own, with its
//!   port. A name that resolves here (DNS rebinding: a site whose name an attacker points
//!   at 127.0.0.1) is refused, whatever it resolves to;
//! - carry the token `iblab ui` printed (in the URL once; the page then holds it in a
//!   cookie of this port, `SameSite=Strict`, `HttpOnly`);
//! - if it says where it comes from (`Origin`, `Sec-Fetch-Site`), come from the page
//!   itself; and a request that changes anything (not GET or HEAD) must say so.
//!
//! A refusal is a 403 that says which rule it broke.

use std::net::{IpAddr, SocketAddr};

/// The rules of one server.
#[derive(Debug, Clone)]
pub struct Guard {
    token: String,
    listen: SocketAddr,
}

/// What a request shows of itself.
#[derive(Debug, Default, Clone)]
pub struct Seen<'a> {
    pub method_changes: bool,
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub fetch_site: Option<&'a str>,
    /// The tokens it carries: in the query, in a header, in the cookie.
    pub tokens: Vec<&'a str>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Host(String),
    Origin(String),
    Token,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Host(h) => write!(
                f,
                "refused: Host `{h}` is not this server (only localhost or its own IP address with its port; names are refused against DNS rebinding)"
            ),
            Refusal::Origin(o) => write!(
                f,
                "refused: a request from `{o}`, not from this page (no other site may start a run)"
            ),
            Refusal::Token => write!(
                f,
                "refused: this page needs its token: open the URL `iblab ui` printed (…/?token=…)"
            ),
        }
    }
}

/// Compare two strings in time that depends only on their lengths.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl Guard {
    pub fn new(token: String, listen: SocketAddr) -> Guard {
        Guard { token, listen }
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The name of the cookie that holds the token (one per port: cookies do not tell
    /// ports apart).
    pub fn cookie(&self) -> String {
        format!("iblab_token_{}", self.listen.port())
    }

    /// Is `host` (a Host header or an Origin's authority) this server?
    fn ours(&self, host: &str) -> bool {
        let (name, port) = match host.rsplit_once(':') {
            Some((n, p)) if !n.ends_with(']') || host.starts_with('[') => (n, p),
            _ => return false,
        };
        if port.parse::<u16>().ok() != Some(self.listen.port()) {
            return false;
        }
        let ip = name.trim_start_matches('[').trim_end_matches(']');
        let l = self.listen.ip();
        if name == "localhost" {
            return l.is_loopback() || l.is_unspecified();
        }
        let Ok(ip) = ip.parse::<IpAddr>() else {
            // A name: refused (DNS rebinding).
            return false;
        };
        if l.is_unspecified() {
            true
        } else if l.is_loopback() {
            ip.is_loopback()
        } else {
            ip == l
        }
    }

    /// May this request go on?
    pub fn check(&self, r: &Seen<'_>) -> Result<(), Refusal> {
        let host = r.host.unwrap_or("");
        if !self.ours(host) {
            return Err(Refusal::Host(host.into()));
        }
        match r.origin {
            Some(o) => {
                let from_us = o
                    .strip_prefix("http://")
                    .is_some_and(|authority| authority == host && self.ours(authority));
                if !from_us {
                    return Err(Refusal::Origin(o.into()));
                }
            }
            // A browser sends Origin with every request that changes something.
            None if r.method_changes => return Err(Refusal::Origin("(no Origin)".into())),
            None => {}
        }
        if let Some(site) = r.fetch_site
            && !matches!(site, "same-origin" | "none")
        {
            return Err(Refusal::Origin(format!("Sec-Fetch-Site: {site}")));
        }
        if !r.tokens.iter().any(|t| same(t, &self.token)) {
            return Err(Refusal::Token);
        }
        Ok(())
    }
}

/// A new random token: 128 bits from the kernel, as hex.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(listen: &str) -> Guard {
        Guard::new("t0ken".into(), listen.parse().unwrap())
    }

    fn get<'a>(host: &'a str, token: &'a str) -> Seen<'a> {
        Seen {
            host: Some(host),
            tokens: vec![token],
            ..Default::default()
        }
    }

    #[test]
    fn hosts_are_this_server_by_address_never_by_name() {
        let l = g("127.0.0.1:8047");
        assert_eq!(l.check(&get("127.0.0.1:8047", "t0ken")), Ok(()));
        assert_eq!(l.check(&get("localhost:8047", "t0ken")), Ok(()));
        assert_eq!(l.check(&get("[::1]:8047", "t0ken")), Ok(()));
        for bad in [
            "evil.example:8047",
            "127.0.0.1.nip.io:8047",
            "127.0.0.1:8048",
            "127.0.0.1",
            "10.0.0.5:8047",
            "",
        ] {
            assert!(
                matches!(l.check(&get(bad, "t0ken")), Err(Refusal::Host(_))),
                "{bad}"
            );
        }
        // --listen 0.0.0.0: any address of its own, still no name but localhost.
        let any = g("0.0.0.0:9000");
        assert_eq!(any.check(&get("192.0.2.7:9000", "t0ken")), Ok(()));
        assert!(any.check(&get("lab.example:9000", "t0ken")).is_err());
        let one = g("192.0.2.7:9000");
        assert_eq!(one.check(&get("192.0.2.7:9000", "t0ken")), Ok(()));
        assert!(one.check(&get("127.0.0.1:9000", "t0ken")).is_err());
    }

    #[test]
    fn the_token_and_the_origin() {
        let l = g("127.0.0.1:8047");
        assert_eq!(
            l.check(&get("127.0.0.1:8047", "wrong")),
            Err(Refusal::Token)
        );
        assert_eq!(
            l.check(&Seen {
                host: Some("127.0.0.1:8047"),
                ..Default::default()
            }),
            Err(Refusal::Token)
        );
        let post = |origin: Option<&'static str>, site: Option<&'static str>| Seen {
            method_changes: true,
            host: Some("127.0.0.1:8047"),
            origin,
            fetch_site: site,
            tokens: vec!["t0ken"],
        };
        assert_eq!(
            l.check(&post(Some("http://127.0.0.1:8047"), Some("same-origin"))),
            Ok(())
        );
        assert!(matches!(
            l.check(&post(Some("http://evil.example"), None)),
            Err(Refusal::Origin(_))
        ));
        assert!(
            matches!(
                l.check(&post(Some("http://localhost:8047"), None)),
                Err(Refusal::Origin(_))
            ),
            "another origin of the same server is another origin"
        );
        assert!(matches!(
            l.check(&post(None, None)),
            Err(Refusal::Origin(_))
        ));
        assert!(matches!(
            l.check(&post(Some("http://127.0.0.1:8047"), Some("cross-site"))),
            Err(Refusal::Origin(_))
        ));
        let t = new_token().unwrap();
        assert_eq!(t.len(), 32);
        assert_ne!(t, new_token().unwrap());
    }
}
