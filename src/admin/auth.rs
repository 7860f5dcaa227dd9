//! Who may change limits at run time (issue 38): the bearer tokens of SLUICE_ADMIN_TOKEN_FILE.
//!
//! The file holds one token a line, optionally preceded by a name and a space (`ops-bot s3cr3t`);
//! the name goes to the audit log (a token without one is named `token <line>`). Blank lines and
//! lines starting with `#` are skipped. The file is read at most [`MAX_TOKEN_FILE_BYTES`], and
//! read again when it changes (a Kubernetes Secret's rotation), so tokens rotate without a
//! restart; a file that no longer parses keeps the tokens that were serving, and says why.
//!
//! A request without `Authorization: Bearer <token>` is refused 401, a wrong token 403, and with
//! no token file every call 403, naming the variable. Tokens are compared by their SHA-256
//! digests, in time that does not depend on where they differ.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use axum::http::StatusCode;

use crate::config::poll::Fingerprint;
use crate::secret::Secret;

/// The largest token file read: 1,000 tokens of a long name and a 64-byte token fit.
pub(crate) const MAX_TOKEN_FILE_BYTES: u64 = 256 * 1024;

/// The variable that names the token file, in the answers that refuse for want of it.
pub(crate) const TOKEN_FILE_VAR: &str = "SLUICE_ADMIN_TOKEN_FILE";

/// One accepted token: the name the audit log gives its changes, and its digest.
#[derive(Clone, Debug)]
struct Token {
    name: String,
    digest: [u8; 32],
}

/// The tokens of one reading of the file.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tokens {
    tokens: Vec<Token>,
}

/// Why a call may not change limits, with the status it is answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// No `Authorization: Bearer` header, or not one that parses.
    #[error("an admin call needs the header `Authorization: Bearer <token>`")]
    NoCredentials,
    /// A token that is not in the file.
    #[error("the bearer token is not one of {TOKEN_FILE_VAR}'s")]
    WrongToken,
    /// No token file: the runtime-limits API is off.
    #[error("runtime limits are off: set {TOKEN_FILE_VAR} to a file of bearer tokens")]
    Off,
}

impl Refusal {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Refusal::NoCredentials => StatusCode::UNAUTHORIZED,
            Refusal::WrongToken | Refusal::Off => StatusCode::FORBIDDEN,
        }
    }
}

/// A line of the token file that cannot be a token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenFileError {
    #[error("{path}: {error}")]
    Unreadable { path: String, error: String },
    #[error("{path}: larger than {max} bytes")]
    TooLarge { path: String, max: u64 },
    #[error("{path}:{line}: expected `[name ]token`, found {fields} fields")]
    Shape {
        path: String,
        line: usize,
        fields: usize,
    },
    #[error("{path}:{line}: the same token as line {first}")]
    Repeated {
        path: String,
        line: usize,
        first: usize,
    },
    #[error("{path}: no token (every line is blank or a comment)")]
    Empty { path: String },
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Whether two digests are equal, looking at every byte whatever the first difference.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Parses the file's text; `path` names it in errors.
    pub(crate) fn parse(path: &str, text: &str) -> Result<Tokens, TokenFileError> {
        let mut tokens: Vec<(usize, Token)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (name, secret) = match fields[..] {
                [token] => (format!("token {n}"), Secret::new(token)),
                [name, token] => (name.to_owned(), Secret::new(token)),
                _ => {
                    return Err(TokenFileError::Shape {
                        path: path.to_owned(),
                        line: n,
                        fields: fields.len(),
                    });
                }
            };
            let digest = digest(secret.expose());
            if let Some((first, _)) = tokens.iter().find(|(_, t)| same(&t.digest, &digest)) {
                return Err(TokenFileError::Repeated {
                    path: path.to_owned(),
                    line: n,
                    first: *first,
                });
            }
            tokens.push((n, Token { name, digest }));
        }
        if tokens.is_empty() {
            return Err(TokenFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Tokens {
            tokens: tokens.into_iter().map(|(_, t)| t).collect(),
        })
    }

    /// The name of the token an `Authorization` header carries, or why it may not act.
    pub(crate) fn check(&self, authorization: Option<&str>) -> Result<String, Refusal> {
        let token = authorization
            .and_then(|h| {
                let (scheme, rest) = h.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::NoCredentials)?;
        let asked = digest(token);
        // Every token compared, so the time says nothing of which one matched.
        let mut found = None;
        for t in &self.tokens {
            if same(&t.digest, &asked) && found.is_none() {
                found = Some(t.name.clone());
            }
        }
        found.ok_or(Refusal::WrongToken)
    }
}

/// Reads the file, at most [`MAX_TOKEN_FILE_BYTES`].
fn read(path: &Path) -> Result<Tokens, TokenFileError> {
    let name = path.display().to_string();
    let unreadable = |e: std::io::Error| TokenFileError::Unreadable {
        path: name.clone(),
        error: e.to_string(),
    };
    let file = fs::File::open(path).map_err(unreadable)?;
    let mut text = String::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(unreadable)?;
    if text.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(TokenFileError::TooLarge {
            path: name,
            max: MAX_TOKEN_FILE_BYTES,
        });
    }
    Tokens::parse(&name, &text)
}

/// The tokens in force: none (the API off), or the file's, read again when it changes.
pub(crate) struct AdminAuth {
    file: Option<PathBuf>,
    tokens: ArcSwap<Tokens>,
    seen: Mutex<Option<Fingerprint>>,
}

impl AdminAuth {
    /// No token file: every call is refused [`Refusal::Off`].
    pub(crate) fn off() -> Self {
        AdminAuth {
            file: None,
            tokens: ArcSwap::from_pointee(Tokens::default()),
            seen: Mutex::new(None),
        }
    }

    /// Reads `file` now: start-up stops on an error, before any port is bound.
    pub(crate) fn from_file(file: PathBuf) -> Result<Self, TokenFileError> {
        let stamp = fs::metadata(&file).ok().map(|m| Fingerprint::of(&m));
        let tokens = read(&file)?;
        Ok(AdminAuth {
            file: Some(file),
            tokens: ArcSwap::from_pointee(tokens),
            seen: Mutex::new(stamp),
        })
    }

    /// Reads the file again when its metadata changed. A file that does not parse keeps the
    /// tokens in force; the error is returned for the caller to log.
    pub(crate) fn refresh(&self) -> Result<bool, TokenFileError> {
        let Some(file) = &self.file else {
            return Ok(false);
        };
        let stamp = fs::metadata(file).ok().map(|m| Fingerprint::of(&m));
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if *seen == stamp {
            return Ok(false);
        }
        *seen = stamp;
        let tokens = read(file)?;
        self.tokens.store(Arc::new(tokens));
        Ok(true)
    }

    /// The caller's name for the audit log, or why it may not act.
    pub(crate) fn check(&self, authorization: Option<&str>) -> Result<String, Refusal> {
        if self.file.is_none() {
            return Err(Refusal::Off);
        }
        self.tokens.load().check(authorization)
    }
}

#[cfg(test)]
mod tests;
