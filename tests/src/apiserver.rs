//! A Kubernetes API stand-in on loopback: list and watch for Services, EndpointSlices and
//! Nodes, the way the API server serves them: a global resourceVersion, paged lists, chunked
//! watch streams of ADDED/MODIFIED/DELETED events, periodic BOOKMARKs, and an ERROR event with
//! code 410 (Gone) when a watch asks for history that was compacted away, which makes clients
//! re-list. Label selectors (`key`, `!key`, `key=value`, `key!=value`) filter lists and watches
//! as the API server's watch cache does: an object that stops matching arrives as DELETED (with
//! its last matching content), one that starts matching as ADDED. Tests change objects, drop
//! watch connections, expire history and change the version `/version` reports through it. It
//! listens on loopback in the test's network namespace, or in another one (`start_in`), for an
//! agent running in a node's namespace.
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

/// The resource kinds served, by URL collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Services,
    EndpointSlices,
    Nodes,
}

impl Resource {
    fn from_path(path: &str) -> Option<Self> {
        match path {
            "/api/v1/services" => Some(Self::Services),
            "/apis/discovery.k8s.io/v1/endpointslices" => Some(Self::EndpointSlices),
            "/api/v1/nodes" => Some(Self::Nodes),
            _ => None,
        }
    }

    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Self::Services => ("v1", "ServiceList"),
            Self::EndpointSlices => ("discovery.k8s.io/v1", "EndpointSliceList"),
            Self::Nodes => ("v1", "NodeList"),
        }
    }

    fn of_object(object: &Value) -> Option<Self> {
        match object["kind"].as_str()? {
            "Service" => Some(Self::Services),
            "EndpointSlice" => Some(Self::EndpointSlices),
            "Node" => Some(Self::Nodes),
            _ => None,
        }
    }
}

fn key_of(object: &Value) -> String {
    format!(
        "{}/{}",
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// One change: (resourceVersion, resource, event type, object, the object before).
type Change = (u64, Resource, &'static str, Value, Option<Value>);

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<Resource, BTreeMap<String, Value>>,
    history: Vec<Change>,
    /// Watches asking for a resourceVersion below this get 410 Gone.
    compacted: u64,
    watches: Vec<TcpStream>,
    /// The minor version `/version` reports ("" until set: "34").
    minor: String,
    /// Every connection open now, by number (a stop closes them all).
    connections: BTreeMap<u64, TcpStream>,
    next_connection: u64,
    requests: BTreeMap<String, usize>,
}

impl State {
    fn record(&mut self, resource: Resource, kind: &'static str, mut object: Value) {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let key = key_of(&object);
        let objects = self.objects.entry(resource).or_default();
        let before = if kind == "DELETED" {
            objects.remove(&key)
        } else {
            objects.insert(key, object.clone())
        };
        self.history.push((self.rv, resource, kind, object, before));
    }
}

/// The accept loop's stop flag and thread.
type Accepting = (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
);

/// A running stand-in; it stops with the test process.
#[derive(Clone)]
pub struct ApiServer {
    pub addr: SocketAddr,
    state: Arc<(Mutex<State>, Condvar)>,
    /// The accept loop while the server is up: it stops (and closes the listening socket)
    /// when its flag is set.
    accepting: Arc<Mutex<Option<Accepting>>>,
    /// The network namespace it listens in (by name, under /run/netns); `None`: the test's.
    netns: Option<String>,
}

/// A listener on `addr` in `netns` (the test's own namespace when `None`): bound on a thread
/// that entered the namespace, so the socket is that namespace's.
fn listen_in(netns: Option<&str>, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let Some(netns) = netns else {
        return Ok(TcpListener::bind(addr)?);
    };
    let file = std::fs::File::open(format!("/run/netns/{netns}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            use std::os::fd::AsRawFd as _;
            // SAFETY: setns(2) on a descriptor `file` keeps open; it moves only this thread,
            // which ends right after the bind.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            Ok(TcpListener::bind(addr)?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the listening thread panicked"))?
    })
}

impl ApiServer {
    pub fn start() -> anyhow::Result<Self> {
        Self::start_on(None)
    }

    /// Listens on loopback in the network namespace `netns` (by name, under /run/netns), where
    /// an agent in that namespace reaches it.
    pub fn start_in(netns: &str) -> anyhow::Result<Self> {
        Self::start_on(Some(netns.to_string()))
    }

    fn start_on(netns: Option<String>) -> anyhow::Result<Self> {
        let listener = listen_in(netns.as_deref(), "127.0.0.1:0".parse()?)?;
        let server = Self {
            addr: listener.local_addr()?,
            state: Arc::new((Mutex::new(State::default()), Condvar::new())),
            accepting: Arc::default(),
            netns,
        };
        server.accept_on(listener)?;
        Ok(server)
    }

    fn accept_on(&self, listener: TcpListener) -> anyhow::Result<()> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = self.clone();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                let stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(_) => continue,
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_nodelay(true);
                let id = {
                    let mut state = s.lock();
                    state.next_connection += 1;
                    let id = state.next_connection;
                    if let Ok(copy) = stream.try_clone() {
                        state.connections.insert(id, copy);
                    }
                    id
                };
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = s.serve(stream);
                    // Its copy goes too, so the connection closes when served.
                    s.lock().connections.remove(&id);
                });
            }
            // Dropping the listener here closes the port: connects are refused.
        });
        *self
            .accepting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((stop, thread));
        Ok(())
    }

    /// Goes down as an API server does in a control-plane upgrade: the port refuses
    /// connections and every open connection (watches included) is closed.
    pub fn stop(&self) {
        let accepting = self
            .accepting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some((stop, thread)) = accepting {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = thread.join();
        }
        let mut state = self.lock();
        let mut open: Vec<TcpStream> = std::mem::take(&mut state.connections)
            .into_values()
            .collect();
        open.append(&mut state.watches);
        for c in open {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        self.state.1.notify_all();
    }

    /// Comes back on the same address, with its objects. `keep_history`: as a server whose
    /// watch cache (etcd's history) still reaches back to the clients' resourceVersions, so
    /// they resume their watches; without it, as a restarted server with a fresh watch cache:
    /// a watch from an older resourceVersion gets 410 Gone and its client re-lists.
    pub fn restart(&self, keep_history: bool) -> anyhow::Result<()> {
        if !keep_history {
            let mut state = self.lock();
            state.compacted = state.rv + 1;
            state.history.clear();
        }
        let listener = listen_in(self.netns.as_deref(), self.addr)?;
        self.accept_on(listener)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates or replaces an object (given as YAML or JSON text of one object).
    pub fn apply(&self, manifest: &str) -> anyhow::Result<()> {
        self.apply_value(serde_saphyr::from_str(manifest)?)
    }

    /// Creates or replaces an object given as JSON.
    pub fn apply_value(&self, object: Value) -> anyhow::Result<()> {
        let resource =
            Resource::of_object(&object).ok_or_else(|| anyhow::anyhow!("unsupported kind"))?;
        let mut state = self.lock();
        let exists = state
            .objects
            .get(&resource)
            .is_some_and(|o| o.contains_key(&key_of(&object)));
        state.record(resource, if exists { "MODIFIED" } else { "ADDED" }, object);
        self.state.1.notify_all();
        Ok(())
    }

    /// Deletes an object by resource, namespace and name.
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) {
        let mut state = self.lock();
        let key = format!("{namespace}/{name}");
        if let Some(object) = state
            .objects
            .get(&resource)
            .and_then(|o| o.get(&key))
            .cloned()
        {
            state.record(resource, "DELETED", object);
            self.state.1.notify_all();
        }
    }

    /// Closes every open watch stream, as a connection loss or an API server restart would.
    pub fn drop_watches(&self) {
        let mut state = self.lock();
        for w in state.watches.drain(..) {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        self.state.1.notify_all();
    }

    /// Atomically: closes every watch, applies `change`, and compacts the history, so the
    /// clients' next watch gets 410 Gone and only a re-list shows them what changed.
    pub fn expire(&self, change: impl FnOnce(&Self)) {
        {
            // From here until the compaction below, every watch request gets 410 Gone: the
            // watches dropped now cannot resume without a re-list.
            let mut state = self.lock();
            state.compacted = u64::MAX;
            for w in state.watches.drain(..) {
                let _ = w.shutdown(std::net::Shutdown::Both);
            }
        }
        change(self);
        let mut state = self.lock();
        state.compacted = state.rv + 1;
        state.history.clear();
        self.state.1.notify_all();
    }

    /// The Kubernetes minor version `/version` reports (34 unless set); it can change while
    /// clients run (a control-plane upgrade).
    pub fn set_minor_version(&self, minor: u16) {
        self.lock().minor = minor.to_string();
    }

    /// How many requests of a kind were served: "list services", "watch endpointslices", ...,
    /// "version"
    pub fn requests(&self, what: &str) -> usize {
        self.lock().requests.get(what).copied().unwrap_or(0)
    }

    /// A kubeconfig that points kube-rs at this server.
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: http://{}\nusers:\n- name: tester\n  user: {{}}\ncontexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: tester\ncurrent-context: stand-in\n",
                self.addr
            ),
        )?;
        Ok(())
    }

    fn serve(&self, stream: TcpStream) -> anyhow::Result<()> {
        let mut reader = BufReader::new(stream.try_clone()?);
        loop {
            let mut request_line = String::new();
            if reader.read_line(&mut request_line)? == 0 {
                return Ok(());
            }
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header)? == 0 || header == "\r\n" {
                    break;
                }
            }
            let target = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("/")
                .to_string();
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let params: BTreeMap<String, String> = query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), percent_decode(v)))
                .collect();
            if path == "/version" {
                self.count("version".into());
                let minor = self.lock().minor.clone();
                let minor = if minor.is_empty() {
                    "34".to_string()
                } else {
                    minor
                };
                respond(
                    &stream,
                    200,
                    &json!({"major": "1", "minor": minor, "gitVersion": format!("v1.{minor}.0")}),
                )?;
                continue;
            }
            let Some(resource) = Resource::from_path(path) else {
                respond(
                    &stream,
                    404,
                    &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}),
                )?;
                continue;
            };
            if params.get("watch").map(String::as_str) == Some("true") {
                return self.watch(stream, resource, &params);
            }
            self.list(&stream, resource, &params)?;
        }
    }

    fn count(&self, what: String) {
        *self.lock().requests.entry(what).or_default() += 1;
    }

    fn list(
        &self,
        stream: &TcpStream,
        resource: Resource,
        params: &BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
        self.count(format!("list {resource:?}").to_lowercase());
        let state = self.lock();
        let selector = Selector::of(params);
        // References: only the page is copied (a list of 20,000 objects in pages of 500 would
        // otherwise copy all of them for every page).
        let all: Vec<&Value> = state
            .objects
            .get(&resource)
            .into_iter()
            .flat_map(|o| o.values())
            .filter(|o| selector.matches(o))
            .collect();
        let start: usize = params
            .get("continue")
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let limit: usize = params
            .get("limit")
            .and_then(|l| l.parse().ok())
            .unwrap_or(usize::MAX);
        let page: Vec<Value> = all
            .iter()
            .skip(start)
            .take(limit)
            .map(|o| (*o).clone())
            .collect();
        let next = start + page.len();
        let (api_version, kind) = resource.list_kind();
        let mut metadata = json!({"resourceVersion": state.rv.to_string()});
        if next < all.len() {
            metadata["continue"] = json!(next.to_string());
        }
        let body =
            json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": page});
        drop(state);
        respond(stream, 200, &body)
    }

    fn watch(
        &self,
        mut stream: TcpStream,
        resource: Resource,
        params: &BTreeMap<String, String>,
    ) -> anyhow::Result<()> {
        self.count(format!("watch {resource:?}").to_lowercase());
        let from: u64 = params
            .get("resourceVersion")
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let timeout = Duration::from_secs(
            params
                .get("timeoutSeconds")
                .and_then(|t| t.parse().ok())
                .unwrap_or(290),
        );
        let selector = Selector::of(params);
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )?;
        let mut state = self.lock();
        if from < state.compacted && from != 0 {
            drop(state);
            chunk(
                &mut stream,
                &json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}}),
            )?;
            return Ok(stream.write_all(b"0\r\n\r\n")?);
        }
        state.watches.push(stream.try_clone()?);
        let mut sent = from;
        let started = Instant::now();
        let mut last_bookmark = Instant::now();
        loop {
            let events: Vec<(u64, &'static str, Value)> = state
                .history
                .iter()
                .filter(|(rv, r, ..)| *rv > sent && *r == resource)
                .filter_map(|(rv, _, t, o, before)| {
                    selector
                        .event(t, o, before.as_ref())
                        .map(|(t, o)| (*rv, t, o))
                })
                .collect();
            let rv_now = state.rv;
            drop(state);
            for (rv, kind, object) in events {
                chunk(&mut stream, &json!({"type": kind, "object": object}))?;
                sent = rv;
            }
            if last_bookmark.elapsed() > Duration::from_millis(500) {
                let (api_version, _) = resource.list_kind();
                let kind = match resource {
                    Resource::Services => "Service",
                    Resource::EndpointSlices => "EndpointSlice",
                    Resource::Nodes => "Node",
                };
                chunk(
                    &mut stream,
                    &json!({"type": "BOOKMARK", "object": {"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": rv_now.to_string()}}}),
                )?;
                sent = sent.max(rv_now);
                last_bookmark = Instant::now();
            }
            if started.elapsed() > timeout {
                return Ok(stream.write_all(b"0\r\n\r\n")?);
            }
            state = self.lock();
            if state.rv > rv_now {
                // Changed while the lock was released: no wait, or the wake-up is lost.
                continue;
            }
            let (s, _) = self
                .state
                .1
                .wait_timeout(state, Duration::from_millis(200))
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state = s;
        }
    }
}

/// A request's field selector (`metadata.name=NAME` only) and label selector.
struct Selector {
    name: Option<String>,
    /// (key, operator, value): "exists", "!exists", "=", "!=".
    labels: Vec<(String, &'static str, String)>,
}

impl Selector {
    fn of(params: &BTreeMap<String, String>) -> Self {
        let name = params
            .get("fieldSelector")
            .and_then(|f| f.strip_prefix("metadata.name="))
            .map(str::to_string);
        let labels = params
            .get("labelSelector")
            .into_iter()
            .flat_map(|s| s.split(','))
            .filter(|r| !r.is_empty())
            .map(|r| {
                if let Some(key) = r.strip_prefix('!') {
                    (key.to_string(), "!exists", String::new())
                } else if let Some((k, v)) = r.split_once("!=") {
                    (k.to_string(), "!=", v.to_string())
                } else if let Some((k, v)) = r.split_once('=') {
                    (k.to_string(), "=", v.trim_start_matches('=').to_string())
                } else {
                    (r.to_string(), "exists", String::new())
                }
            })
            .collect();
        Self { name, labels }
    }

    fn matches(&self, object: &Value) -> bool {
        if self
            .name
            .as_deref()
            .is_some_and(|n| object["metadata"]["name"] != n)
        {
            return false;
        }
        let labels = &object["metadata"]["labels"];
        self.labels.iter().all(|(key, op, value)| {
            let label = labels.get(key.as_str()).and_then(Value::as_str);
            match *op {
                "exists" => label.is_some(),
                "!exists" => label.is_none(),
                "=" => label == Some(value.as_str()),
                _ => label != Some(value.as_str()),
            }
        })
    }

    /// What a watcher with this selector gets for one change, as the watch cache sends it:
    /// an object that starts matching is ADDED, one that stops matching is DELETED (with its
    /// content before the change, at the change's resourceVersion).
    fn event(
        &self,
        kind: &'static str,
        object: &Value,
        before: Option<&Value>,
    ) -> Option<(&'static str, Value)> {
        if kind == "DELETED" {
            return self.matches(object).then(|| ("DELETED", object.clone()));
        }
        let was = before.is_some_and(|b| self.matches(b));
        match (was, self.matches(object)) {
            (false, true) => Some(("ADDED", object.clone())),
            (true, true) => Some(("MODIFIED", object.clone())),
            (true, false) => {
                let mut last = before.cloned().unwrap_or(Value::Null);
                last["metadata"]["resourceVersion"] = object["metadata"]["resourceVersion"].clone();
                Some(("DELETED", last))
            }
            (false, false) => None,
        }
    }
}

/// Decodes a query parameter's %XX escapes (and `+` as a space).
fn percent_decode(value: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        char::from(b)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some(hex(*bytes.get(i + 1)?)? * 16 + hex(*bytes.get(i + 2)?)?))
            .flatten();
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn respond(mut stream: &TcpStream, code: u16, body: &Value) -> anyhow::Result<()> {
    let body = serde_json::to_vec(body)?;
    write!(
        stream,
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        if code == 200 { "OK" } else { "Error" },
        body.len()
    )?;
    stream.write_all(&body)?;
    Ok(())
}

fn chunk(stream: &mut TcpStream, event: &Value) -> anyhow::Result<()> {
    let line = serde_json::to_vec(event)?;
    // One write per chunk, as Go's server does (with TCP_NODELAY): several small writes would
    // wait out the client's delayed ACK (40 ms on loopback).
    let mut out = format!("{:x}\r\n", line.len() + 1).into_bytes();
    out.extend_from_slice(&line);
    out.extend_from_slice(b"\n\r\n");
    stream.write_all(&out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Selector, percent_decode};
    use serde_json::json;

    fn labelled(value: Option<&str>) -> serde_json::Value {
        let mut o = json!({"kind": "Service", "metadata": {"name": "s", "namespace": "d", "resourceVersion": "7"}});
        if let Some(v) = value {
            o["metadata"]["labels"] = json!({"service.kubernetes.io/headless": v});
        }
        o
    }

    #[test]
    fn objects_leaving_and_entering_a_label_selection_are_deleted_and_added() {
        let params = [(
            "labelSelector".to_string(),
            percent_decode("%21service.kubernetes.io%2Fheadless"),
        )]
        .into_iter()
        .collect();
        let s = Selector::of(&params);
        let (plain, headless) = (labelled(None), labelled(Some("")));
        assert!(s.matches(&plain) && !s.matches(&headless));
        let kind = |t: &'static str, o: &serde_json::Value, b: Option<&serde_json::Value>| {
            s.event(t, o, b).map(|(k, _)| k)
        };
        assert_eq!(kind("ADDED", &plain, None), Some("ADDED"));
        assert_eq!(kind("ADDED", &headless, None), None);
        assert_eq!(kind("MODIFIED", &headless, Some(&plain)), Some("DELETED"));
        assert_eq!(kind("MODIFIED", &plain, Some(&headless)), Some("ADDED"));
        assert_eq!(kind("MODIFIED", &plain, Some(&plain)), Some("MODIFIED"));
        assert_eq!(kind("MODIFIED", &headless, Some(&headless)), None);
        assert_eq!(kind("DELETED", &headless, None), None);
        assert_eq!(kind("DELETED", &plain, None), Some("DELETED"));
        // What leaves the selection is sent as it was, at the change's resourceVersion.
        let mut now = headless.clone();
        now["metadata"]["resourceVersion"] = json!("8");
        let (_, sent) = s.event("MODIFIED", &now, Some(&plain)).expect("an event");
        assert_eq!(sent["metadata"]["labels"], serde_json::Value::Null);
        assert_eq!(sent["metadata"]["resourceVersion"], "8");
    }

    #[test]
    fn query_parameters_are_percent_decoded() {
        assert_eq!(percent_decode("a%3Db%2Fc+d%21"), "a=b/c d!");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
