//! Zarr stores in object storage: `s3://bucket/key`, `gs://bucket/key` and
//! `http(s)://host/path`, read through zarrs' object-store adapter (`zarrs_object_store`
//! over the `object_store` crate) and, for the chunks this crate decodes itself, through
//! the same clients directly.
//!
//! # Credentials and endpoints
//! S3 takes the standard `AWS_*` variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL` for S3-compatible stores), then
//! the profile `AWS_PROFILE` (default `default`) of `~/.aws/credentials` and
//! `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`). Without
//! credentials, requests go unsigned, as public buckets expect. GCS takes
//! `GOOGLE_APPLICATION_CREDENTIALS` (or the `GOOGLE_*` variables), else anonymous access.
//! [`RemoteOptions::endpoint_url`] overrides the endpoint.
//!
//! # Latency
//! An object store answers each request after tens of milliseconds, whatever its size.
//! Each read of a band of chunks keeps [`RemoteOptions::concurrency`] requests in flight
//! and decodes the chunks in order as they arrive, so that the latency overlaps the
//! decoding; the plan counts those chunks' encodings in the actor's budget. Transient
//! failures (5xx, timeouts, resets) are retried with exponential backoff
//! ([`RemoteOptions::retries`] times, within [`RemoteOptions::retry_timeout`]) by the
//! clients; a permanent one (403, a bucket that does not exist) is an error naming the
//! object. A chunk object that does not exist reads as the fill value.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use zarrs_object_store::object_store::{
    self, path::Path as ObjectPath, ClientOptions, GetOptions, GetRange, ObjectStore, RetryConfig,
};

/// How object stores are reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteOptions {
    /// The endpoint of an S3-compatible store (`http://127.0.0.1:9000`), over
    /// `AWS_ENDPOINT_URL` and the profile's `endpoint_url`.
    pub endpoint_url: Option<String>,
    /// Requests each reader keeps in flight.
    pub concurrency: usize,
    /// Retries of a request that failed transiently.
    pub retries: usize,
    /// How long a request, with its retries, may take.
    pub retry_timeout: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            endpoint_url: None,
            concurrency: 8,
            retries: 10,
            retry_timeout: Duration::from_secs(180),
        }
    }
}

/// The options stores are opened with, unless set.
static OPTIONS: Mutex<Option<RemoteOptions>> = Mutex::new(None);

impl RemoteOptions {
    /// Sets the options that stores opened from now on use (the command line's
    /// `--endpoint-url` and `--io-concurrency`).
    pub fn set_default(options: RemoteOptions) {
        *OPTIONS.lock().unwrap_or_else(|e| e.into_inner()) = Some(options);
    }

    /// The options stores are opened with.
    pub fn current() -> RemoteOptions {
        OPTIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default()
    }
}

/// Whether `spec` names an object-store URL rather than a local path.
pub fn is_url(spec: &str) -> bool {
    ["s3://", "s3a://", "gs://", "gcs://", "http://", "https://"]
        .iter()
        .any(|s| spec.starts_with(s))
}

/// Splits the URL `spec` into the store's URL and an array path after the last `:` of its
/// path part (`s3://bucket/store.zarr:group/array`); a port's colon is never taken.
pub(crate) fn split_url(spec: &str) -> (String, String) {
    let after_scheme = spec.find("://").map_or(0, |i| i + 3);
    let path_start = spec[after_scheme..]
        .find('/')
        .map_or(spec.len(), |i| after_scheme + i);
    match spec[path_start..].rfind(':') {
        Some(i) => (
            spec[..path_start + i].trim_end_matches('/').to_string(),
            spec[path_start + i + 1..].trim_matches('/').to_string(),
        ),
        None => (spec.trim_end_matches('/').to_string(), String::new()),
    }
}

/// One object store and the prefix of a Zarr store inside it.
pub(crate) struct Remote {
    /// The store's URL, for messages.
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// Requests in flight per reader.
    concurrency: usize,
    /// Whole objects fetched ahead of their reads, across panels ([`Remote::fetch_ahead`]).
    ahead: Mutex<HashMap<String, Fetched>>,
}

/// An object fetched ahead: the read-ahead it was fetched for, and the request.
struct Fetched {
    owner: u64,
    request: tokio::task::JoinHandle<Result<Option<Vec<u8>>, String>>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("url", &self.url).finish()
    }
}

/// The one runtime that drives every request of the process: two threads, as requests
/// wait on the network, not the CPU.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("rankwise-io")
            .enable_all()
            .build()
            .expect("cannot start the I/O runtime")
    })
}

/// Runs `f` to completion on the I/O runtime, from a thread that is not one of its own.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// zarrs' synchronous view of an async store, driven by [`runtime`].
#[derive(Clone, Copy)]
pub(crate) struct BlockOn;

impl zarrs::storage::storage_adapter::async_to_sync::AsyncToSyncBlockOn for BlockOn {
    fn block_on<F: core::future::Future>(&self, future: F) -> F::Output {
        block_on(future)
    }
}

/// The profile values of `~/.aws/credentials` and `~/.aws/config` for `AWS_PROFILE`.
fn aws_profile() -> HashMap<String, String> {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let mut values = HashMap::new();
    let files = [
        (
            std::env::var_os("AWS_SHARED_CREDENTIALS_FILE")
                .map(std::path::PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws/credentials"))),
            profile.clone(),
        ),
        (
            std::env::var_os("AWS_CONFIG_FILE")
                .map(std::path::PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws/config"))),
            // The config file names its sections `profile NAME`, but for the default one.
            if profile == "default" {
                profile.clone()
            } else {
                format!("profile {profile}")
            },
        ),
    ];
    for (file, section) in files {
        let Some(text) = file.and_then(|f| std::fs::read_to_string(f).ok()) else {
            continue;
        };
        for (k, v) in ini_section(&text, &section) {
            values.entry(k).or_insert(v);
        }
    }
    values
}

/// The `key = value` lines of section `[name]` of an INI text.
fn ini_section(text: &str, name: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = section.trim() == name;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
    }
    out
}

/// The client options every store gets: HTTP allowed where the endpoint says so, and
/// timeouts that turn a server that stopped answering into an error, not a hang.
fn client_options(allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_allow_http(allow_http)
        .with_connect_timeout(Duration::from_secs(10))
        .with_timeout(Duration::from_secs(120))
}

fn retry(options: &RemoteOptions) -> RetryConfig {
    RetryConfig {
        max_retries: options.retries,
        retry_timeout: options.retry_timeout,
        ..RetryConfig::default()
    }
}

/// Builds the client for the store at `url`.
fn build(url: &str, options: &RemoteOptions) -> Result<Arc<dyn ObjectStore>, String> {
    let scheme = &url[..url.find("://").unwrap_or(0)];
    let store: Arc<dyn ObjectStore> = match scheme {
        "s3" | "s3a" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let mut b = AmazonS3Builder::from_env();
            let has_env_key = std::env::var_os("AWS_ACCESS_KEY_ID").is_some();
            let profile = aws_profile();
            let mut has_key = has_env_key;
            if !has_env_key {
                for (key, config) in [
                    ("aws_access_key_id", AmazonS3ConfigKey::AccessKeyId),
                    ("aws_secret_access_key", AmazonS3ConfigKey::SecretAccessKey),
                    ("aws_session_token", AmazonS3ConfigKey::Token),
                ] {
                    if let Some(v) = profile.get(key) {
                        b = b.with_config(config, v);
                        has_key |= key == "aws_access_key_id";
                    }
                }
            }
            if std::env::var_os("AWS_REGION").is_none()
                && std::env::var_os("AWS_DEFAULT_REGION").is_none()
            {
                b = b.with_region(profile.get("region").map_or("us-east-1", |r| r.as_str()));
            }
            let endpoint = options
                .endpoint_url
                .clone()
                .or_else(|| std::env::var("AWS_ENDPOINT_URL_S3").ok())
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                .or_else(|| profile.get("endpoint_url").cloned());
            let allow_http = endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://"));
            if let Some(e) = &endpoint {
                // An S3-compatible server at an address takes the bucket in the path.
                b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
            }
            // Without credentials, requests go unsigned (public buckets), not to the
            // instance metadata service, which a cluster node may not have.
            if !has_key && std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_none() {
                b = b.with_skip_signature(true);
            }
            Arc::new(
                b.with_url(url)
                    .with_client_options(client_options(allow_http))
                    .with_retry(retry(options))
                    .build()
                    .map_err(|e| e.to_string())?,
            )
        }
        "gs" | "gcs" => {
            use object_store::gcp::GoogleCloudStorageBuilder;
            let mut b = GoogleCloudStorageBuilder::from_env();
            if std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").is_none()
                && std::env::var_os("GOOGLE_SERVICE_ACCOUNT").is_none()
                && std::env::var_os("GOOGLE_SERVICE_ACCOUNT_PATH").is_none()
                && std::env::var_os("GOOGLE_SERVICE_ACCOUNT_KEY").is_none()
            {
                b = b.with_skip_signature(true);
            }
            Arc::new(
                b.with_url(url)
                    .with_client_options(client_options(false))
                    .with_retry(retry(options))
                    .build()
                    .map_err(|e| e.to_string())?,
            )
        }
        "http" | "https" => {
            use object_store::http::HttpBuilder;
            // The store is the server's root; the store's path is the prefix.
            let after = url.find("://").map_or(0, |i| i + 3);
            let root = match url[after..].find('/') {
                Some(i) => &url[..after + i],
                None => url,
            };
            Arc::new(
                HttpBuilder::new()
                    .with_url(root)
                    .with_client_options(client_options(scheme == "http"))
                    .with_retry(retry(options))
                    .build()
                    .map_err(|e| e.to_string())?,
            )
        }
        _ => return Err(format!("unknown scheme `{scheme}://`")),
    };
    Ok(store)
}

/// The path of the store inside its object store: the URL's path, but for an S3 or GCS
/// URL, whose first component is the bucket.
fn prefix_of(url: &str) -> ObjectPath {
    let after = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[after..];
    let path = match rest.find('/') {
        Some(i) => &rest[i + 1..],
        None => "",
    };
    ObjectPath::from(path)
}

impl Remote {
    /// Opens (or finds already open) the store at `url` with the current options.
    pub(crate) fn open(url: &str) -> Result<Arc<Remote>, String> {
        static OPEN: Mutex<Vec<(String, RemoteOptions, Arc<Remote>)>> = Mutex::new(Vec::new());
        let options = RemoteOptions::current();
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, r)) = open.iter().find(|(u, o, _)| u == url && *o == options) {
            return Ok(r.clone());
        }
        let store = build(url, &options)?;
        let remote = Arc::new(Remote {
            url: url.to_string(),
            store,
            prefix: prefix_of(url),
            concurrency: options.concurrency.max(1),
            ahead: Mutex::new(HashMap::new()),
        });
        open.push((url.to_string(), options, remote.clone()));
        Ok(remote)
    }

    /// The store's URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Requests in flight per reader.
    pub(crate) fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// The client, for zarrs' adapter, rooted at the store's prefix.
    pub(crate) fn zarrs_store(&self) -> Arc<dyn zarrs::storage::ReadableListableStorageTraits> {
        let prefixed =
            object_store::prefix::PrefixStore::new(self.store.clone(), self.prefix.clone());
        let store = Arc::new(zarrs_object_store::AsyncObjectStore::new(prefixed));
        Arc::new(
            zarrs::storage::storage_adapter::async_to_sync::AsyncToSyncStorageAdapter::new(
                store, BlockOn,
            ),
        )
    }

    fn path(&self, key: &str) -> ObjectPath {
        self.prefix
            .parts()
            .chain(ObjectPath::from(key).parts())
            .collect()
    }

    /// What a failed request says, naming the object.
    fn error(&self, key: &str, e: object_store::Error) -> String {
        format!("{}/{key}: {e}", self.url)
    }

    /// The whole object `key`, `None` when it does not exist. An object longer than `most`
    /// bytes is refused by its length before its body is read.
    pub(crate) async fn get_bounded(
        &self,
        key: &str,
        most: u64,
    ) -> Result<Option<Vec<u8>>, String> {
        let result = match self
            .store
            .get_opts(&self.path(key), GetOptions::default())
            .await
        {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error(key, e)),
        };
        if result.meta.size > most {
            return Err(format!(
                "{}/{key} is {} bytes, more than any valid encoding of its chunk ({most} bytes \
                 at most); refused without reading it",
                self.url, result.meta.size
            ));
        }
        let mut out = Vec::with_capacity(result.meta.size as usize);
        let mut body = result.into_stream();
        while let Some(part) = body.next().await {
            let part = part.map_err(|e| self.error(key, e))?;
            if out.len() as u64 + part.len() as u64 > most {
                return Err(format!(
                    "{}/{key} sent more than any valid encoding of its chunk ({most} bytes)",
                    self.url
                ));
            }
            out.extend_from_slice(&part);
        }
        Ok(Some(out))
    }

    /// The last `n` bytes of object `key` (or its first, `at_start`) and its length; `None`
    /// when it does not exist.
    pub(crate) async fn get_end(
        &self,
        key: &str,
        n: u64,
        at_start: bool,
    ) -> Result<Option<(Vec<u8>, u64)>, String> {
        let range = if at_start {
            GetRange::Bounded(0..n)
        } else {
            GetRange::Suffix(n)
        };
        let options = GetOptions {
            range: Some(range),
            ..GetOptions::default()
        };
        let result = match self.store.get_opts(&self.path(key), options).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error(key, e)),
        };
        let len = result.meta.size;
        let bytes = result.bytes().await.map_err(|e| self.error(key, e))?;
        if bytes.len() as u64 != n.min(len) {
            return Err(format!(
                "{}/{key}: asked for {n} bytes of its {}, received {}",
                self.url,
                if at_start { "start" } else { "end" },
                bytes.len()
            ));
        }
        Ok(Some((bytes.to_vec(), len)))
    }

    /// Byte ranges of object `key`, `concurrency` requests at a time, in order.
    pub(crate) async fn get_ranges(
        &self,
        key: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>, String> {
        let path = self.path(key);
        let fetch = |r: Range<u64>| {
            let path = path.clone();
            async move {
                let want = r.end - r.start;
                let bytes = self
                    .store
                    .get_range(&path, r.clone())
                    .await
                    .map_err(|e| self.error(key, e))?;
                if bytes.len() as u64 != want {
                    return Err(format!(
                        "{}/{key}: asked for bytes {}..{}, received {}",
                        self.url,
                        r.start,
                        r.end,
                        bytes.len()
                    ));
                }
                Ok::<_, String>(bytes.to_vec())
            }
        };
        futures::stream::iter(ranges.iter().cloned())
            .map(fetch)
            .buffered(self.concurrency)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// Whether object `key` exists.
    pub(crate) fn exists(&self, key: &str) -> Result<bool, String> {
        match block_on(self.store.head(&self.path(key))) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error(key, e)),
        }
    }

    /// The small object `key` (metadata), `None` when it does not exist.
    pub(crate) fn read_small(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        block_on(self.get_bounded(key, 64 << 20))
    }

    /// Fetches the whole objects `keys` (each at most `most` bytes), `concurrency` at a
    /// time, handing them over in order: at most `concurrency` requests and one finished
    /// object wait beside the one the caller decodes.
    pub(crate) fn fetch_in_order(self: &Arc<Self>, keys: Vec<String>, most: u64) -> InOrder {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let me = self.clone();
        runtime().spawn(async move {
            let me2 = me.clone();
            let mut results = futures::stream::iter(keys)
                .map(move |k| {
                    let me = me2.clone();
                    async move { me.get_bounded(&k, most).await }
                })
                .buffered(me.concurrency);
            while let Some(r) = results.next().await {
                if tx.send(r).await.is_err() {
                    // The reader stopped (an error elsewhere in its band).
                    return;
                }
            }
        });
        InOrder { rx }
    }
}

impl Remote {
    fn fetched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fetched>> {
        // Every update is one insert or remove: a poisoned lock is still consistent.
        self.ahead.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts requests for the whole objects `keys` (each at most `most` bytes), in order,
    /// for the read-ahead `owner`, until it holds `cap` objects fetched ahead and not yet
    /// taken; keys already fetched ahead are skipped.
    ///
    /// This is what hides a store's latency when a panel is one or a few chunk objects: the
    /// requests of one panel's read ([`Remote::fetch_in_order`]) stop at its edge, so a
    /// reader had as many requests in flight as the panel has chunks. The caller sizes
    /// `cap` from the encodings its memory plan counts and its reads leave unused.
    pub(crate) fn fetch_ahead(
        self: &Arc<Self>,
        owner: u64,
        cap: usize,
        keys: impl Iterator<Item = String>,
        most: u64,
    ) {
        let mut table = self.fetched();
        let mut held = table.values().filter(|f| f.owner == owner).count();
        for key in keys {
            if held >= cap {
                break;
            }
            if table.contains_key(&key) {
                continue;
            }
            let me = self.clone();
            let k = key.clone();
            let request = runtime().spawn(async move { me.get_bounded(&k, most).await });
            table.insert(key, Fetched { owner, request });
            held += 1;
        }
    }

    /// The request for `key` fetched ahead, if there is one; the caller awaits it.
    pub(crate) fn take_fetched(
        &self,
        key: &str,
    ) -> Option<tokio::task::JoinHandle<Result<Option<Vec<u8>>, String>>> {
        self.fetched().remove(key).map(|f| f.request)
    }

    /// Cancels and drops what was fetched ahead for `owner` and not taken (its pass ended).
    pub(crate) fn drop_fetched(&self, owner: u64) {
        self.fetched().retain(|_, f| {
            if f.owner == owner {
                f.request.abort();
            }
            f.owner != owner
        });
    }
}

/// Objects fetched ahead, in the order asked.
pub(crate) struct InOrder {
    rx: tokio::sync::mpsc::Receiver<Result<Option<Vec<u8>>, String>>,
}

impl InOrder {
    /// The next object (`None` inside for one that does not exist).
    pub(crate) fn next(&mut self) -> Result<Option<Vec<u8>>, String> {
        self.rx
            .blocking_recv()
            .unwrap_or_else(|| Err("the I/O runtime stopped fetching".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_at_the_array_but_never_at_a_port() {
        assert_eq!(
            split_url("s3://b/x.zarr:g/a"),
            ("s3://b/x.zarr".into(), "g/a".into())
        );
        assert_eq!(
            split_url("s3://b/x.zarr/"),
            ("s3://b/x.zarr".into(), String::new())
        );
        assert_eq!(
            split_url("http://127.0.0.1:9000/x.zarr"),
            ("http://127.0.0.1:9000/x.zarr".into(), String::new())
        );
        assert_eq!(
            split_url("http://127.0.0.1:9000/d/x.zarr:arr/"),
            ("http://127.0.0.1:9000/d/x.zarr".into(), "arr".into())
        );
        assert!(is_url("gs://b/k") && is_url("https://h/p") && !is_url("/data/x.zarr"));
    }

    #[test]
    fn prefixes_leave_out_the_bucket() {
        assert_eq!(prefix_of("s3://bucket/a/b.zarr").as_ref(), "a/b.zarr");
        assert_eq!(prefix_of("s3://bucket").as_ref(), "");
        assert_eq!(prefix_of("http://h:1/srv/x.zarr").as_ref(), "srv/x.zarr");
    }

    /// A store in memory with objects `k0`..`k9` under `x.zarr/`, each its key's bytes.
    fn in_memory() -> Arc<Remote> {
        use object_store::{memory::InMemory, PutPayload};
        let store = Arc::new(InMemory::new());
        for i in 0..10 {
            let path = ObjectPath::from(format!("x.zarr/k{i}"));
            let body = PutPayload::from(format!("k{i}").into_bytes());
            block_on(store.put(&path, body)).unwrap();
        }
        Arc::new(Remote {
            url: "memory://b/x.zarr".into(),
            store,
            prefix: ObjectPath::from("x.zarr"),
            concurrency: 2,
            ahead: Mutex::new(HashMap::new()),
        })
    }

    fn held(remote: &Remote, owner: u64) -> Vec<String> {
        let mut keys: Vec<_> = (remote.fetched().iter())
            .filter(|(_, f)| f.owner == owner)
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn fetching_ahead_holds_at_most_its_cap_per_owner_and_drops_what_was_not_taken() {
        let remote = in_memory();
        let keys = |r: Range<usize>| r.map(|i| format!("k{i}"));
        remote.fetch_ahead(1, 3, keys(0..10), 100);
        assert_eq!(held(&remote, 1), ["k0", "k1", "k2"]);
        // Another read-ahead has its own cap, and skips what is already being fetched.
        remote.fetch_ahead(2, 2, keys(2..10), 100);
        assert_eq!(held(&remote, 2), ["k3", "k4"]);
        // A taken object is the object, and frees its place under the cap.
        let got = remote.take_fetched("k0").expect("k0 was fetched ahead");
        assert_eq!(block_on(got).unwrap(), Ok(Some(b"k0".to_vec())));
        assert!(remote.take_fetched("k0").is_none(), "taken once");
        remote.fetch_ahead(1, 3, keys(1..10), 100);
        assert_eq!(held(&remote, 1), ["k1", "k2", "k5"]);
        // The bound on an object's length holds for objects fetched ahead.
        remote.fetch_ahead(3, 1, keys(9..10), 1);
        let refused = block_on(remote.take_fetched("k9").unwrap()).unwrap();
        assert!(refused
            .unwrap_err()
            .contains("more than any valid encoding"));
        // The end of a pass drops its objects and no other's.
        remote.drop_fetched(1);
        assert!(held(&remote, 1).is_empty());
        assert_eq!(held(&remote, 2), ["k3", "k4"]);
        remote.drop_fetched(2);
        assert!(remote.fetched().is_empty());
    }

    #[test]
    fn profiles_are_read_from_their_section() {
        let text = "[default]\naws_access_key_id = A\n\n[other]\n# c\nAWS_Secret_Access_Key=B\n";
        assert_eq!(
            ini_section(text, "default"),
            vec![("aws_access_key_id".into(), "A".into())]
        );
        assert_eq!(
            ini_section(text, "other"),
            vec![("aws_secret_access_key".into(), "B".into())]
        );
        assert!(ini_section(text, "none").is_empty());
    }
}
