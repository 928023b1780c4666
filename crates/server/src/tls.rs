//! TLS of the API's listener (`[tls]`): the administrator's certificate and key files, or
//! (`[tls] auto = true`) a private CA and a server certificate the server makes itself.
//!
//! - Files: `cert_file` (PEM, the server's certificate first, its chain after it) and
//!   `key_file` (PEM, readable by its owner only). Both are read again on SIGHUP; a pair
//!   that cannot be used then changes nothing and is logged.
//! - Auto: `<data_dir>/tls/` holds `ca.pem` (readable by all: what clients trust),
//!   `ca.key`, and each server's `server-<host>-<port>.pem` (its certificate and the CA)
//!   and `.key` (0600); the servers of one data directory share the CA. The CA lasts ten
//!   years and is kept across restarts; a server certificate lasts 90 days, is
//!   made for the listen address, the host's names and addresses, `127.0.0.1`, `::1`,
//!   `localhost` and `[tls] names`, and is made again when it has less than 30 days left
//!   or the names change (at start, on SIGHUP and twice a day).
//! - Refused at start, naming the key: a missing or unreadable file, a key that is not its
//!   certificate's, a certificate that is expired or not yet valid, a key file that others
//!   may read.
//!
//! The listener offers ALPN `h2` (gRPC, HTTP/2) and `http/1.1`.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use time::OffsetDateTime;

/// `[tls]` as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// With `cert_file`: the CA that signed it, for the jobs' clients to trust.
    pub ca_file: Option<PathBuf>,
    pub auto: bool,
    /// More names (DNS names or addresses) for the automatic certificate.
    pub names: Vec<String>,
    /// With `auto`: the loopback address whose port 443 serves the managed service's
    /// host names to jobs ([`JOBS_ADDRESS`] unless `jobs_address` says otherwise).
    pub jobs_address: Option<IpAddr>,
}

impl TlsSettings {
    /// The CA that clients (the jobs' among them) are given to trust: `auto`'s, or with
    /// `cert_file` the administrator's `ca_file` (without one, the hosts' own CA
    /// certificates are taken to trust the certificate).
    pub fn clients_ca(&self, data_dir: &Path) -> Option<PathBuf> {
        match self.auto {
            true => Some(auto_ca_file(data_dir)),
            false => self.cert_file.as_ref().and(self.ca_file.clone()),
        }
    }
}

/// The default `[tls] jobs_address`: a loopback address nothing else uses.
pub const JOBS_ADDRESS: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 255, 0, 1));

/// The managed service's host names that jobs' clients call with no endpoint of their
/// own: the SDK's (`{region}-aiplatform`, `aiplatform`), Cloud Storage's, and the
/// resource manager's (the SDK asks it for a project's id; it answers 404 here, and the
/// SDK keeps the number it has).
pub fn service_names(region: &str) -> Vec<String> {
    vec![
        format!("{region}-aiplatform.googleapis.com"),
        "aiplatform.googleapis.com".to_string(),
        "storage.googleapis.com".to_string(),
        "cloudresourcemanager.googleapis.com".to_string(),
    ]
}

impl TlsSettings {
    pub fn enabled(&self) -> bool {
        self.auto || self.cert_file.is_some() || self.key_file.is_some()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("[tls] {key} ({}): {message}", path.display())]
    File { key: &'static str, path: PathBuf, message: String },
    #[error("[tls] {0}")]
    Config(String),
    #[error("[tls] auto: {0}")]
    Auto(String),
}

/// The automatic server certificate's life, and how long before its end it is renewed.
const SERVER_DAYS: i64 = 90;
const RENEW_DAYS: i64 = 30;
const CA_DAYS: i64 = 3650;
/// How often the automatic certificate is looked at while the server runs.
pub const RENEW_CHECK: Duration = Duration::from_secs(12 * 3600);
/// The names of the files of `[tls] auto`, under `<data_dir>/tls/`.
const CA_FILE: &str = "ca.pem";

/// The directory of `[tls] auto`'s CA and certificates.
fn auto_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

/// `[tls] auto`'s CA certificate, what clients (jobs, followers, users) trust.
pub fn auto_ca_file(data_dir: &Path) -> PathBuf {
    auto_dir(data_dir).join(CA_FILE)
}
const CA_KEY: &str = "ca.key";

enum Source {
    Files { cert: PathBuf, key: PathBuf, ca: Option<PathBuf> },
    /// `tag`: this server's own among the servers of one data directory (they share the
    /// CA; each has its own certificate, for its own address).
    Auto { dir: PathBuf, names: Vec<String>, tag: String },
}

/// The automatic server certificate's files: `server-<tag>.pem`, `.key` and `.names`.
fn server_files(dir: &Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    (dir.join(format!("server-{tag}.pem")), dir.join(format!("server-{tag}.key")), dir.join(format!("server-{tag}.names")))
}

/// This server's tag: the host's name and the listen port.
fn server_tag(listen: SocketAddr) -> String {
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    let host: String = host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    format!("{host}-{}", listen.port())
}

/// The listener's TLS: its configuration and the certificate in use (replaced on reload).
pub struct Tls {
    source: Source,
    /// The listener of `[tls] jobs_address`: the service's names, for jobs.
    for_jobs: bool,
    current: Arc<RwLock<Arc<CertifiedKey>>>,
    not_after: RwLock<OffsetDateTime>,
    config: Arc<rustls::ServerConfig>,
}

#[derive(Debug)]
struct Resolver(Arc<RwLock<Arc<CertifiedKey>>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|c| Arc::clone(&c))
    }
}

/// ring's provider (no C toolchain beyond cc to build); it has no post-quantum key
/// exchange, which rustls now marks by deprecating its constructor.
#[allow(deprecated)]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Load (or, with `auto`, make) the listener's certificate; None when `[tls]` is off.
    pub fn start(settings: &TlsSettings, data_dir: &Path, listen: SocketAddr) -> Result<Option<Arc<Tls>>, TlsError> {
        let source = match (settings.auto, &settings.cert_file, &settings.key_file) {
            (false, None, None) if settings.ca_file.is_some() => {
                return Err(TlsError::Config("ca_file without cert_file and key_file: it names the CA of your own certificate".into()))
            }
            (false, None, None) => return Ok(None),
            (true, _, _) if settings.ca_file.is_some() => {
                return Err(TlsError::Config("ca_file goes with cert_file and key_file; auto = true makes and gives its own CA".into()))
            }
            (true, None, None) => Source::Auto { dir: auto_dir(data_dir), names: auto_names(listen, &settings.names), tag: server_tag(listen) },
            (true, _, _) => return Err(TlsError::Config("auto = true and cert_file/key_file exclude each other: give one or the other".into())),
            (false, Some(cert), Some(key)) => Source::Files { cert: cert.clone(), key: key.clone(), ca: settings.ca_file.clone() },
            (false, Some(_), None) => return Err(TlsError::Config("cert_file without key_file: give both".into())),
            (false, None, Some(_)) => return Err(TlsError::Config("key_file without cert_file: give both".into())),
        };
        Ok(Some(Tls::serving(source, false)?))
    }

    /// The TLS of the jobs' listener: a certificate of the automatic CA for the managed
    /// service's host names ([`service_names`]) and `address`.
    pub fn for_jobs(data_dir: &Path, address: IpAddr, region: &str) -> Result<Arc<Tls>, TlsError> {
        let mut names = service_names(region);
        names.push(address.to_string());
        Tls::serving(Source::Auto { dir: auto_dir(data_dir), names, tag: format!("jobs-{address}") }, true)
    }

    fn serving(source: Source, for_jobs: bool) -> Result<Arc<Tls>, TlsError> {
        let (key, not_after) = load(&source)?;
        let current = Arc::new(RwLock::new(Arc::new(key)));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(Arc::clone(&current))));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(Tls { source, for_jobs, current, not_after: RwLock::new(not_after), config: Arc::new(config) }))
    }

    /// Is this the jobs' listener (`[tls] jobs_address`)?
    pub fn serves_jobs(&self) -> bool {
        self.for_jobs
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config))
    }

    /// The CA file clients trust: `<data_dir>/tls/ca.pem` with `auto`; with files, none
    /// is known (the administrator's CA is theirs).
    pub fn ca_file(&self) -> Option<PathBuf> {
        match &self.source {
            Source::Auto { dir, .. } => Some(dir.join(CA_FILE)),
            Source::Files { ca, .. } => ca.clone(),
        }
    }

    /// When the certificate in use ends.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after.read().map(|t| *t).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// Read the files again (SIGHUP), or renew the automatic certificate when it is due;
    /// what was done, or why nothing changed (then the certificate in use stays).
    pub fn reload(&self) -> Result<String, TlsError> {
        let (key, not_after) = load(&self.source)?;
        if let Ok(mut c) = self.current.write() {
            *c = Arc::new(key);
        }
        if let Ok(mut t) = self.not_after.write() {
            *t = not_after;
        }
        Ok(format!("TLS certificate valid until {}", rfc3339(not_after)))
    }
}

/// `[tls]` looked at without changing anything (`trainyard doctor`): with files, whether
/// they can be used and until when; with `auto`, what is there.
pub fn check(settings: &TlsSettings, data_dir: &Path) -> Result<String, TlsError> {
    match (&settings.cert_file, &settings.key_file) {
        (Some(cert), Some(key)) if !settings.auto => {
            let (certified, end) = load_pair(cert, "cert_file", key, "key_file")?;
            if let Some(ca) = &settings.ca_file {
                check_signed_by(&certified, ca)?;
            }
            Ok(format!("{} valid until {}", cert.display(), rfc3339(end)))
        }
        _ if settings.auto => {
            let ca = auto_ca_file(data_dir);
            Ok(if ca.exists() {
                format!("auto: clients trust {}", ca.display())
            } else {
                format!("auto: the server makes its CA at {} when it starts", ca.display())
            })
        }
        _ => Err(TlsError::Config("give cert_file and key_file together, or auto = true alone".into())),
    }
}

/// The certificate and key of `source`, checked; for `Auto`, made first where missing or due.
fn load(source: &Source) -> Result<(CertifiedKey, OffsetDateTime), TlsError> {
    match source {
        Source::Files { cert, key, ca } => {
            let loaded = load_pair(cert, "cert_file", key, "key_file")?;
            if let Some(ca) = ca {
                check_signed_by(&loaded.0, ca)?;
            }
            Ok(loaded)
        }
        Source::Auto { dir, names, tag } => {
            ensure_auto(dir, names, tag)?;
            let (cert, key, _) = server_files(dir, tag);
            load_pair(&cert, "auto", &key, "auto")
        }
    }
}

fn file_error(key: &'static str, path: &Path, message: impl Into<String>) -> TlsError {
    TlsError::File { key, path: path.to_path_buf(), message: message.into() }
}

/// `[tls] ca_file`: PEM certificates, one of which `certified`'s chain leads to (for any
/// of its names), as the jobs' clients will check it.
fn check_signed_by(certified: &CertifiedKey, ca: &Path) -> Result<(), TlsError> {
    let key = "ca_file";
    let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
        .map_err(|e| file_error(key, ca, format!("cannot read: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(key, ca, format!("not a PEM certificate file: {e}")))?;
    let mut store = rustls::RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(roots);
    if added == 0 {
        return Err(file_error(key, ca, "holds no CA certificate (PEM \"BEGIN CERTIFICATE\") that can be read"));
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider())
        .build()
        .map_err(|e| file_error(key, ca, format!("cannot be used: {e}")))?;
    let Some((leaf, intermediates)) = certified.cert.split_first() else {
        return Err(TlsError::Config("cert_file holds no certificate".into()));
    };
    // Any name: only the chain is looked at here (the names are the clients' to check).
    let name = rustls_pki_types::ServerName::try_from("trainyard.invalid").map_err(|e| TlsError::Config(e.to_string()))?;
    let now = rustls_pki_types::UnixTime::now();
    use rustls::client::danger::ServerCertVerifier;
    use rustls::{CertificateError, Error};
    match verifier.verify_server_cert(leaf, intermediates, &name, &[], now) {
        Ok(_) | Err(Error::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. })) => Ok(()),
        Err(e) => Err(file_error(key, ca, format!("is not the CA of cert_file: its chain does not lead there ({e})"))),
    }
}

/// Read a certificate chain and its key, and check them as a start refuses them.
fn load_pair(cert: &Path, cert_key: &'static str, key: &Path, key_key: &'static str) -> Result<(CertifiedKey, OffsetDateTime), TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error(cert_key, cert, format!("cannot read: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(cert_key, cert, format!("not a PEM certificate file: {e}")))?;
    let Some(leaf) = chain.first() else {
        return Err(file_error(cert_key, cert, "holds no certificate (PEM \"BEGIN CERTIFICATE\")"));
    };
    let meta = std::fs::metadata(key).map_err(|e| file_error(key_key, key, format!("cannot read: {e}")))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(file_error(
            key_key,
            key,
            format!("mode {:o}: a private key must be readable by its owner only (chmod 600)", meta.permissions().mode() & 0o777),
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key_key, key, format!("not a PEM private key: {e}")))?;
    let (not_before, not_after) = validity(leaf).ok_or_else(|| file_error(cert_key, cert, "cannot read the certificate's validity"))?;
    let now = OffsetDateTime::now_utc();
    if not_after <= now {
        return Err(file_error(cert_key, cert, format!("the certificate expired at {}", rfc3339(not_after))));
    }
    if not_before > now {
        return Err(file_error(cert_key, cert, format!("the certificate is valid only from {}", rfc3339(not_before))));
    }
    let certified = CertifiedKey::from_der(chain, private, &provider())
        .map_err(|e| file_error(key_key, key, format!("does not go with the certificate of {}: {e}", cert.display())))?;
    Ok((certified, not_after))
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// The names of the automatic certificate: the listen address (unless it is every
/// address: then the host's own), the host's name, the loopback names and `extra`.
fn auto_names(listen: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if let Ok(host) = nix::unistd::gethostname() {
        if let Some(h) = host.to_str().filter(|h| !h.is_empty()) {
            names.push(h.to_string());
        }
    }
    if listen.ip().is_unspecified() {
        if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
            for a in addrs {
                let ip: Option<IpAddr> = a.address.and_then(|s| {
                    s.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())).or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
                });
                // Link-local IPv6 addresses need a zone, which a certificate cannot name.
                if let Some(ip) = ip.filter(|ip| !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)) {
                    names.push(ip.to_string());
                }
            }
        }
    } else {
        names.push(listen.ip().to_string());
    }
    names.extend(extra.iter().cloned());
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

fn ca_params() -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::CommonName, "Trainyard private CA");
    p.distinguished_name.push(rcgen::DnType::OrganizationName, "Trainyard");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign, rcgen::KeyUsagePurpose::DigitalSignature];
    p
}

/// Write `data` to `path` with `mode`, through a file beside it renamed over it.
fn write_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    // The umask may have taken bits the file needs (ca.pem is for every user).
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, path)
}

/// Make the CA (when missing) and the server certificate (when missing, due, or made for
/// other names) of `[tls] auto` in `dir`.
fn ensure_auto(dir: &Path, names: &[String], tag: &str) -> Result<(), TlsError> {
    let auto = |what: &str, e: &dyn std::fmt::Display| TlsError::Auto(format!("{what} in {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(|e| auto("cannot create the directory", &e))?;
    // ca.pem is for every user of this host to read.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(|e| auto("cannot set the directory's mode", &e))?;
    // The servers of one data directory make and read the CA one at a time.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.join(".lock"))
        .map_err(|e| auto("cannot open the lock file", &e))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| auto("cannot lock", &e))?;
    let now = OffsetDateTime::now_utc();
    let (ca_pem, ca_key) = (dir.join(CA_FILE), dir.join(CA_KEY));
    let (server_pem, server_key, server_names) = server_files(dir, tag);
    let ca_key_pem = match (std::fs::read_to_string(&ca_key), std::fs::read(&ca_pem)) {
        (Ok(k), Ok(_)) => k,
        _ => {
            let key = rcgen::KeyPair::generate().map_err(|e| auto("cannot make the CA's key", &e))?;
            let mut params = ca_params();
            params.not_before = now - time::Duration::hours(1);
            params.not_after = now + time::Duration::days(CA_DAYS);
            let cert = params.self_signed(&key).map_err(|e| auto("cannot make the CA", &e))?;
            write_file(&ca_key, key.serialize_pem().as_bytes(), 0o600).map_err(|e| auto("cannot write ca.key", &e))?;
            write_file(&ca_pem, cert.pem().as_bytes(), 0o644).map_err(|e| auto("cannot write ca.pem", &e))?;
            // A new CA: whatever the server certificate was, it is made again below.
            let _ = std::fs::remove_file(&server_names);
            key.serialize_pem()
        }
    };
    let wanted = names.join("\n");
    let made_for = std::fs::read_to_string(&server_names).unwrap_or_default();
    let current_end = std::fs::read(&server_pem)
        .ok()
        .and_then(|pem| CertificateDer::pem_slice_iter(&pem).next().and_then(Result::ok))
        .and_then(|c| validity(&c))
        .map(|(_, end)| end);
    let due = current_end.is_none_or(|end| end - now < time::Duration::days(RENEW_DAYS));
    if !due && made_for == wanted && server_key.exists() {
        return Ok(());
    }
    let ca_keypair = rcgen::KeyPair::from_pem(&ca_key_pem).map_err(|e| auto("cannot read ca.key", &e))?;
    let issuer = rcgen::Issuer::new(ca_params(), ca_keypair);
    let key = rcgen::KeyPair::generate().map_err(|e| auto("cannot make the server's key", &e))?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| auto("a name cannot be in a certificate", &e))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, names.first().cloned().unwrap_or_else(|| "localhost".into()));
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(SERVER_DAYS);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).map_err(|e| auto("cannot sign the server certificate", &e))?;
    let ca_text = std::fs::read_to_string(&ca_pem).map_err(|e| auto("cannot read ca.pem", &e))?;
    write_file(&server_key, key.serialize_pem().as_bytes(), 0o600).map_err(|e| auto("cannot write the server's key", &e))?;
    write_file(&server_pem, format!("{}{ca_text}", cert.pem()).as_bytes(), 0o644).map_err(|e| auto("cannot write the server's certificate", &e))?;
    write_file(&server_names, wanted.as_bytes(), 0o644).map_err(|e| auto("cannot write the server's names", &e))?;
    tracing::info!("made a TLS server certificate for {} (valid {SERVER_DAYS} days, signed by {})", names.join(", "), ca_pem.display());
    Ok(())
}

/// A certificate's notBefore and notAfter, read from its DER (RFC 5280 4.1: Certificate
/// → tbsCertificate → [version], serialNumber, signature, issuer, validity).
pub fn validity(cert: &[u8]) -> Option<(OffsetDateTime, OffsetDateTime)> {
    let (tag, certificate, _) = der(cert)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, mut tbs, _) = der(certificate)?;
    if tag != 0x30 {
        return None;
    }
    let mut fields = Vec::new();
    while !tbs.is_empty() && fields.len() < 5 {
        let (tag, value, rest) = der(tbs)?;
        // The explicit version ([0]) is not one of the counted fields.
        if !(fields.is_empty() && tag == 0xa0) {
            fields.push((tag, value));
        }
        tbs = rest;
    }
    let &(tag, validity) = fields.get(3)?;
    if tag != 0x30 {
        return None;
    }
    let (t1, v1, rest) = der(validity)?;
    let (t2, v2, _) = der(rest)?;
    Some((der_time(t1, v1)?, der_time(t2, v2)?))
}

/// One DER element: (tag, contents, what follows).
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first & 0x80 == 0 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| a << 8 | usize::from(b));
        rest = &rest[n..];
        len
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// UTCTime (YYMMDDHHMMSSZ) or GeneralizedTime (YYYYMMDDHHMMSSZ).
fn der_time(tag: u8, value: &[u8]) -> Option<OffsetDateTime> {
    let s = std::str::from_utf8(value).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        0x17 if s.len() == 12 => {
            let yy: i32 = s[..2].parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &s[2..])
        }
        0x18 if s.len() == 14 => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    let n = |i: usize| rest.get(i..i + 2)?.parse::<u8>().ok();
    let month = time::Month::try_from(n(0)?).ok()?;
    let date = time::Date::from_calendar_date(year, month, n(2)?).ok()?;
    let at = time::Time::from_hms(n(4)?, n(6)?, n(8)?).ok()?;
    Some(time::PrimitiveDateTime::new(date, at).assume_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_auto() -> TlsSettings {
        TlsSettings { auto: true, ..TlsSettings::default() }
    }

    #[test]
    fn auto_makes_a_ca_and_keeps_it_across_restarts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listen: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        let tls = Tls::start(&settings_auto(), dir.path(), listen).expect("auto").expect("on");
        let ca = tls.ca_file().expect("a CA file");
        let mode = |f: &str| std::fs::metadata(dir.path().join("tls").join(f)).expect("file").permissions().mode() & 0o777;
        assert_eq!(mode("ca.pem"), 0o644);
        assert_eq!(mode("ca.key"), 0o600);
        let tag = server_tag(listen);
        assert_eq!(mode(&format!("server-{tag}.key")), 0o600);
        let first = std::fs::read(&ca).expect("ca");
        let (server_pem, _, _) = server_files(&dir.path().join("tls"), &server_tag(listen));
        let server = std::fs::read(&server_pem).expect("server");
        let days = (tls.not_after() - OffsetDateTime::now_utc()).whole_days();
        assert!((SERVER_DAYS - 1..=SERVER_DAYS).contains(&days), "{days}");
        drop(tls);
        Tls::start(&settings_auto(), dir.path(), listen).expect("again").expect("on");
        assert_eq!(std::fs::read(&ca).expect("ca"), first, "the CA is kept");
        assert_eq!(std::fs::read(&server_pem).expect("server"), server, "a valid certificate is kept");
        // Other names: a new server certificate from the same CA.
        let more = TlsSettings { names: vec!["trainyard.example".into()], ..settings_auto() };
        Tls::start(&more, dir.path(), listen).expect("names").expect("on");
        assert_ne!(std::fs::read(&server_pem).expect("server"), server);
        assert_eq!(std::fs::read(&ca).expect("ca"), first);
    }

    #[test]
    fn files_bad_pairs_are_refused_naming_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let listen: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        Tls::start(&settings_auto(), dir.path(), listen).expect("auto");
        let tls = dir.path().join("tls");
        let tag = server_tag(listen);
        let (cert_name, key_name, names_name) = (format!("server-{tag}.pem"), format!("server-{tag}.key"), format!("server-{tag}.names"));
        let files = |cert: &str, key: &str| TlsSettings { cert_file: Some(tls.join(cert)), key_file: Some(tls.join(key)), ..TlsSettings::default() };
        assert!(Tls::start(&files(&cert_name, &key_name), dir.path(), listen).expect("a good pair").is_some());
        let err = |s: TlsSettings| Tls::start(&s, dir.path(), listen).err().map(|e| e.to_string()).unwrap_or_default();
        let missing = err(files("nothing.pem", &key_name));
        assert!(missing.contains("cert_file") && missing.contains("cannot read"), "{missing}");
        let wrong = err(files(&cert_name, "ca.key"));
        assert!(wrong.contains("key_file") && wrong.contains("does not go with"), "{wrong}");
        std::fs::set_permissions(tls.join(&key_name), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let open = err(files(&cert_name, &key_name));
        assert!(open.contains("key_file") && open.contains("chmod 600"), "{open}");
        let not_pem = err(files(&names_name, "ca.key"));
        assert!(not_pem.contains("cert_file"), "{not_pem}");
        let half = err(TlsSettings { cert_file: Some(tls.join(&cert_name)), ..TlsSettings::default() });
        assert!(half.contains("key_file"), "{half}");
    }

    #[test]
    fn an_expired_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.not_before = OffsetDateTime::now_utc() - time::Duration::days(10);
        params.not_after = OffsetDateTime::now_utc() - time::Duration::days(1);
        let cert = params.self_signed(&key).expect("cert");
        write_file(&dir.path().join("c.pem"), cert.pem().as_bytes(), 0o644).expect("write");
        write_file(&dir.path().join("k.pem"), key.serialize_pem().as_bytes(), 0o600).expect("write");
        let s = TlsSettings { cert_file: Some(dir.path().join("c.pem")), key_file: Some(dir.path().join("k.pem")), ..TlsSettings::default() };
        let e = Tls::start(&s, dir.path(), "127.0.0.1:1".parse().expect("addr")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("cert_file") && e.contains("expired"), "{e}");
        let (from, to) = validity(cert.der()).expect("validity");
        assert_eq!((to - from).whole_days(), 9);
    }
}
