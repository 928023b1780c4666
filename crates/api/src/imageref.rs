//! Container image references (`containerSpec.imageUri`, `pythonPackageSpec.executorImageUri`)
//! checked against the grammar docker and podman use (distribution/reference):
//!
//! ```text
//! reference := name [ ":" tag ] [ "@" digest ]
//! name      := [ domain "/" ] path-component { "/" path-component }    (at most 255 bytes)
//! domain    := ( host-component { "." host-component } ) [ ":" port ]
//! host-component := [a-zA-Z0-9] ( [a-zA-Z0-9-]* [a-zA-Z0-9] )?
//! port      := [0-9]+
//! path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
//! tag       := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
//! digest    := algorithm ":" hex
//! algorithm := [A-Za-z][A-Za-z0-9]* ( [-_+.] [A-Za-z][A-Za-z0-9]* )*
//! hex       := [0-9a-fA-F]{32,}
//! ```
//!
//! The first component of the name is the domain only if it contains `.` or `:` or is
//! `localhost` (so `python:3.11` is the path `python` with tag `3.11`, and
//! `localhost:5000/a/b` is the registry `localhost:5000` with path `a/b`). For the
//! algorithms podman and docker know (`sha256`, `sha384`, `sha512`) the hex part must
//! also be lowercase and of that algorithm's exact length, as they refuse it otherwise.

/// Longest name (domain and path, without tag and digest), in bytes.
pub const MAX_IMAGE_NAME_LEN: usize = 255;
/// Longest tag, in characters.
pub const MAX_IMAGE_TAG_LEN: usize = 128;
/// Fewest hexadecimal digits in a digest.
pub const MIN_DIGEST_HEX_LEN: usize = 32;

/// A valid image reference split into its parts, borrowed from the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageReference<'a> {
    /// Registry host with optional port (`gcr.io`, `localhost:5000`), if written.
    pub domain: Option<&'a str>,
    /// Repository path (`vertex-ai/training/tf-cpu.2-17.py310`, `python`).
    pub path: &'a str,
    /// Tag after `:`, if any.
    pub tag: Option<&'a str>,
    /// Digest after `@` (`sha256:...`), if any.
    pub digest: Option<&'a str>,
}

/// A text that is not a valid image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a valid image reference: {reason}")]
pub struct ImageRefError {
    /// The text that was given.
    pub text: String,
    /// What is wrong with it (no final period).
    pub reason: String,
}

/// Parses `[domain/]path[:tag][@digest]` (see the module documentation for the grammar).
pub fn parse_image_reference(text: &str) -> Result<ImageReference<'_>, ImageRefError> {
    split_reference(text).map_err(|reason| ImageRefError {
        text: text.to_string(),
        reason,
    })
}

fn split_reference(text: &str) -> Result<ImageReference<'_>, String> {
    if text.is_empty() {
        return Err("it is empty".into());
    }
    if let Some(i) = text.find("://") {
        return Err(format!(
            "it starts with a URL scheme ({:?}); an image reference has none, \
             e.g. \"gcr.io/project/image:tag\"",
            &text[..i + 3]
        ));
    }
    if text.chars().any(char::is_whitespace) {
        return Err("it contains whitespace".into());
    }
    let (name_tag, digest) = match text.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (text, None),
    };
    if let Some(d) = digest {
        check_digest(d)?;
    }
    // A ':' after the last '/' starts the tag; one before it is the registry port.
    let (name, tag) = match name_tag.rfind(':') {
        Some(i) if name_tag.rfind('/').is_none_or(|s| s < i) => {
            (&name_tag[..i], Some(&name_tag[i + 1..]))
        }
        _ => (name_tag, None),
    };
    if let Some(t) = tag {
        check_tag(t)?;
    }
    if name.is_empty() {
        return Err("the repository name is missing".into());
    }
    if name.len() > MAX_IMAGE_NAME_LEN {
        return Err(format!(
            "the name (without tag and digest) is {} characters long; at most \
             {MAX_IMAGE_NAME_LEN} are allowed",
            name.len()
        ));
    }
    if name.starts_with('/') {
        return Err("it starts with '/'".into());
    }
    if name.ends_with('/') {
        return Err("it ends with '/'".into());
    }
    if name.contains("//") {
        return Err("it has an empty path component ('//')".into());
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
            check_domain(first)?;
            (Some(first), rest)
        }
        _ => (None, name),
    };
    for component in path.split('/') {
        check_path_component(component)?;
    }
    Ok(ImageReference {
        domain,
        path,
        tag,
        digest,
    })
}

/// `host[:port]`, host being `.`-joined components of letters, digits and inner `-`.
fn check_domain(domain: &str) -> Result<(), String> {
    let (host, port) = match domain.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (domain, None),
    };
    let host_component_ok = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
    };
    if !host.split('.').all(host_component_ok) {
        return Err(format!(
            "registry host {host:?} is not valid (letters, digits and '-' in '.'-separated \
             parts, each starting and ending with a letter or digit)"
        ));
    }
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|x| x.is_ascii_digit()) {
            return Err(format!("registry port {p:?} must be a number"));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((.|_|__|-+)[a-z0-9]+)*`.
fn check_path_component(component: &str) -> Result<(), String> {
    let lower_alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    let b = component.as_bytes();
    let mut i = 0;
    let ok = loop {
        let start = i;
        while i < b.len() && lower_alnum(b[i]) {
            i += 1;
        }
        if i == start {
            break false;
        }
        if i == b.len() {
            break true;
        }
        match b[i] {
            b'.' => i += 1,
            b'_' => i += if b.get(i + 1) == Some(&b'_') { 2 } else { 1 },
            b'-' => {
                while i < b.len() && b[i] == b'-' {
                    i += 1;
                }
            }
            _ => break false,
        }
    };
    if ok {
        return Ok(());
    }
    if component.bytes().any(|x| x.is_ascii_uppercase()) {
        return Err(format!(
            "repository path component {component:?} must be lowercase"
        ));
    }
    Err(format!(
        "repository path component {component:?} is not valid (lowercase letters and digits, \
         separated by '.', '_', '__' or '-', neither first nor last)"
    ))
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), String> {
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let b = tag.as_bytes();
    if b.is_empty() {
        return Err("the tag after ':' is empty".into());
    }
    if b.len() > MAX_IMAGE_TAG_LEN {
        return Err(format!(
            "the tag is {} characters long; at most {MAX_IMAGE_TAG_LEN} are allowed",
            b.len()
        ));
    }
    if !word(b[0]) || !b.iter().all(|&x| word(x) || x == b'.' || x == b'-') {
        return Err(format!(
            "tag {tag:?} is not valid (letters, digits, '_', '.' and '-', not starting \
             with '.' or '-')"
        ));
    }
    Ok(())
}

/// `algorithm:hex`; exact lowercase hex for sha256, sha384 and sha512.
fn check_digest(digest: &str) -> Result<(), String> {
    if digest.is_empty() {
        return Err("the digest after '@' is empty".into());
    }
    let shape = || {
        format!(
            "digest {digest:?} is not valid (ALGORITHM:HEX, e.g. \"sha256:\" followed by 64 \
             hexadecimal digits)"
        )
    };
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(shape());
    };
    let algorithm_component_ok = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
    };
    if !algorithm
        .split(['-', '_', '+', '.'])
        .all(algorithm_component_ok)
        || hex.len() < MIN_DIGEST_HEX_LEN
        || !hex.bytes().all(|x| x.is_ascii_hexdigit())
    {
        return Err(shape());
    }
    let exact = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Ok(()),
    };
    if hex.len() != exact || hex.bytes().any(|x| x.is_ascii_uppercase()) {
        return Err(format!(
            "digest {digest:?} is not valid: {algorithm} takes exactly {exact} lowercase \
             hexadecimal digits, got {}",
            hex.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text, domain, path, tag, digest.
    type Parts<'a> = (
        &'a str,
        Option<&'a str>,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
    );

    fn sha256() -> String {
        format!("sha256:{}", "0123456789abcdef".repeat(4))
    }

    #[test]
    fn valid_references_parse_into_their_parts() {
        let digest = sha256();
        let pinned = format!("gcr.io/my-project/trainer@{digest}");
        let both = format!("localhost:5000/a/b:v1@{digest}");
        let cases: Vec<Parts> = vec![
            ("python:3.11", None, "python", Some("3.11"), None),
            ("python:3.12", None, "python", Some("3.12"), None),
            (
                "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest",
                Some("us-docker.pkg.dev"),
                "vertex-ai/training/tf-cpu.2-17.py310",
                Some("latest"),
                None,
            ),
            (
                &pinned,
                Some("gcr.io"),
                "my-project/trainer",
                None,
                Some(&digest),
            ),
            (
                "localhost/trainyard/python:test",
                Some("localhost"),
                "trainyard/python",
                Some("test"),
                None,
            ),
            (
                "localhost:5000/a/b",
                Some("localhost:5000"),
                "a/b",
                None,
                None,
            ),
            (
                &both,
                Some("localhost:5000"),
                "a/b",
                Some("v1"),
                Some(&digest),
            ),
            ("i", None, "i", None, None),
            ("x", None, "x", None, None),
            ("busybox", None, "busybox", None, None),
            ("local/bench", None, "local/bench", None, None),
            ("gcr.io/p/mnist", Some("gcr.io"), "p/mnist", None, None),
            ("gcr.io", None, "gcr.io", None, None),
            ("localhost", None, "localhost", None, None),
            ("localhost:5000", None, "localhost", Some("5000"), None),
            (
                "Registry.Example.COM/a",
                Some("Registry.Example.COM"),
                "a",
                None,
                None,
            ),
            ("a__b/c--d/e_f.g", None, "a__b/c--d/e_f.g", None, None),
            ("x:_Tag.1-2", None, "x", Some("_Tag.1-2"), None),
            (
                "127.0.0.1:5000/x:1",
                Some("127.0.0.1:5000"),
                "x",
                Some("1"),
                None,
            ),
        ];
        for (text, domain, path, tag, dig) in cases {
            let r = parse_image_reference(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                r,
                ImageReference {
                    domain,
                    path,
                    tag,
                    digest: dig
                },
                "{text}"
            );
        }
    }

    #[test]
    fn invalid_references_are_refused_with_the_reason() {
        let long_name = "a".repeat(MAX_IMAGE_NAME_LEN + 1);
        let long_tag = format!("x:{}", "t".repeat(MAX_IMAGE_TAG_LEN + 1));
        let short_sha = format!("x@sha256:{}", "a".repeat(40));
        let upper_sha = format!("x@{}", sha256().to_uppercase().replace("SHA256", "sha256"));
        let cases: Vec<(&str, &str)> = vec![
            ("", "it is empty"),
            ("Foo", "\"Foo\" must be lowercase"),
            ("Foo Bar", "whitespace"),
            ("a b", "whitespace"),
            ("x\t", "whitespace"),
            ("docker://x", "URL scheme (\"docker://\")"),
            ("https://gcr.io/p/x", "URL scheme (\"https://\")"),
            ("x:", "the tag after ':' is empty"),
            ("x:-bad", "tag \"-bad\" is not valid"),
            ("x:.bad", "tag \".bad\" is not valid"),
            ("x:a/b", "registry port \"a\" must be a number"),
            (&long_tag, "at most 128"),
            ("/x", "starts with '/'"),
            ("x/", "ends with '/'"),
            ("x//y", "empty path component"),
            ("x@sha256:zz", "digest \"sha256:zz\" is not valid"),
            ("x@", "the digest after '@' is empty"),
            ("x@sha256", "digest \"sha256\" is not valid"),
            ("x@1sha:0123456789abcdef0123456789abcdef", "is not valid"),
            (&short_sha, "exactly 64 lowercase"),
            (&upper_sha, "exactly 64 lowercase"),
            ("x@sha256:abc@def", "is not valid"),
            (":tag", "repository name is missing"),
            ("@sha256:0", "is not valid"),
            (&long_name, "at most 255"),
            ("a..b", "\"a..b\" is not valid"),
            ("a___b", "\"a___b\" is not valid"),
            ("-a", "\"-a\" is not valid"),
            ("a-", "\"a-\" is not valid"),
            ("a.", "\"a.\" is not valid"),
            ("_a", "\"_a\" is not valid"),
            ("a+b", "\"a+b\" is not valid"),
            ("gcr.io/My-Project/x", "\"My-Project\" must be lowercase"),
            ("ünïcode", "is not valid"),
            ("gcr.io/", "ends with '/'"),
            ("-bad.io/x", "registry host \"-bad.io\" is not valid"),
            ("bad-.io/x", "registry host \"bad-.io\" is not valid"),
            ("a_b.io/x", "registry host \"a_b.io\" is not valid"),
            ("gcr..io/x", "registry host \"gcr..io\" is not valid"),
            ("localhost:/x", "registry port \"\" must be a number"),
            ("localhost:50a/x", "registry port \"50a\" must be a number"),
            ("h:1:2/x", "registry port \"1:2\" must be a number"),
        ];
        for (text, reason) in cases {
            let err = parse_image_reference(text).expect_err(text);
            let message = err.to_string();
            assert!(
                message.starts_with(&format!("{text:?} is not a valid image reference: ")),
                "{message}"
            );
            assert!(message.contains(reason), "{text:?}: {message}");
        }
    }

    #[test]
    fn the_name_limit_counts_domain_and_path_only() {
        let name = format!("gcr.io/{}", "a".repeat(MAX_IMAGE_NAME_LEN - 7));
        assert_eq!(name.len(), MAX_IMAGE_NAME_LEN);
        parse_image_reference(&format!("{name}:{}@{}", "t".repeat(128), sha256()))
            .expect("255-byte name, long tag and digest");
        assert!(parse_image_reference(&format!("{name}a")).is_err());
    }

    #[test]
    fn other_digest_algorithms_follow_the_grammar() {
        for ok in [
            format!("x@sha512:{}", "ab".repeat(64)),
            format!("x@sha384:{}", "0".repeat(96)),
            format!("x@multihash+base58:{}", "A".repeat(32)),
            format!("x@tarsum.v1+sha256:{}", "f".repeat(64)),
        ] {
            parse_image_reference(&ok).unwrap_or_else(|e| panic!("{e}"));
        }
        for bad in [
            format!("x@sha512:{}", "ab".repeat(32)),
            format!("x@md5:{}", "0".repeat(31)),
            format!("x@a-:{}", "0".repeat(32)),
            format!("x@:{}", "0".repeat(32)),
        ] {
            assert!(parse_image_reference(&bad).is_err(), "{bad}");
        }
    }
}
