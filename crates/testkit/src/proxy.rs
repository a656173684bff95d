//! A fault-injecting TCP proxy in front of a server (the API server, moto):
//! cut, stall and restore a client's connections while the server keeps
//! running, or hold one request past its caller's timeout.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP proxy on loopback in front of the API server that a test can cut
/// (every open connection dropped, new ones refused), stall (connections stay
/// open but nothing is forwarded) and restore: a client cut off from the API
/// server while the server itself keeps running.
pub struct TcpProxy {
    pub port: u16,
    links: Arc<Links>,
    accept_task: tokio::task::JoinHandle<()>,
}

/// The link state for new connections, and each open connection's own.
struct Links {
    default: std::sync::Mutex<Link>,
    open: std::sync::Mutex<Vec<tokio::sync::watch::Sender<Link>>>,
    hold: std::sync::Mutex<Option<Hold>>,
}

/// Requests to the target that carry `marker`: the first is held for `for_`
/// before it is passed on; each is counted.
struct Hold {
    marker: Vec<u8>,
    for_: std::time::Duration,
    seen: usize,
}

impl Links {
    /// How long to hold a chunk on its way to the target, if at all.
    fn hold_for(&self, chunk: &[u8]) -> Option<std::time::Duration> {
        let mut hold = self.hold.lock().unwrap_or_else(|e| e.into_inner());
        let h = hold.as_mut()?;
        if !chunk.windows(h.marker.len()).any(|w| w == h.marker.as_slice()) {
            return None;
        }
        h.seen += 1;
        (h.seen == 1).then_some(h.for_)
    }
}

impl Links {
    fn default_link(&self) -> Link {
        *self.default.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets every open connection's link (and, if `also_new`, new ones').
    fn set(&self, link: Link, also_new: bool) {
        if also_new {
            *self.default.lock().unwrap_or_else(|e| e.into_inner()) = link;
        }
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|l| !l.is_closed());
        for l in open.iter() {
            l.send_replace(link);
        }
    }
}

/// The state of a `TcpProxy`'s link to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Up,
    Cut,
    Stalled,
}

impl TcpProxy {
    pub async fn start(target: String) -> TcpProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a proxy port");
        let port = listener.local_addr().expect("a bound address").port();
        let links = Arc::new(Links {
            default: std::sync::Mutex::new(Link::Up),
            open: std::sync::Mutex::default(),
            hold: std::sync::Mutex::default(),
        });
        let accepting = links.clone();
        let accept_task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let initial = accepting.default_link();
                if initial == Link::Cut {
                    continue; // refused: dropped at once
                }
                let (link, rx) = tokio::sync::watch::channel(initial);
                accepting
                    .open
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(link);
                tokio::spawn(forward(inbound, target.clone(), rx, accepting.clone()));
            }
        });
        TcpProxy {
            port,
            links,
            accept_task,
        }
    }

    /// Drops every open connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.links.set(Link::Cut, true);
    }

    /// Keeps every connection open, and accepts new ones, but forwards nothing
    /// in either direction until `restore` (requests hang instead of failing).
    /// `cut` still drops them all.
    pub fn stall(&self) {
        self.links.set(Link::Stalled, true);
    }

    /// Stalls the connections open now, for good (a half-dead TCP
    /// connection), while new connections pass: what a client sees when a
    /// load balancer or NAT silently drops its long-lived watch.
    pub fn stall_open_connections(&self) {
        self.links.set(Link::Stalled, false);
    }

    /// Forwards again: new connections after a cut; after a stall, the held
    /// connections resume where they stopped, nothing lost.
    pub fn restore(&self) {
        self.links.set(Link::Up, true);
    }

    /// Holds the first request carrying `marker` for `hold` before passing it
    /// on, even when its caller has given up meanwhile: a request the server
    /// carries out after the client's timeout. Later ones pass at once.
    pub fn hold_first(&self, marker: &[u8], hold: std::time::Duration) {
        *self.links.hold.lock().unwrap_or_else(|e| e.into_inner()) = Some(Hold {
            marker: marker.to_vec(),
            for_: hold,
            seen: 0,
        });
    }

    /// How many requests carried the marker of [`TcpProxy::hold_first`].
    pub fn held_seen(&self) -> usize {
        let hold = self.links.hold.lock().unwrap_or_else(|e| e.into_inner());
        hold.as_ref().map_or(0, |h| h.seen)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.links.set(Link::Cut, true);
    }
}

/// Why a forwarded connection ended early: the proxy cut it (or was dropped).
fn cut_off() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "cut by the proxy")
}

/// Waits out a stall. Ok once the link is up, Err once it is cut.
async fn passable(link: &mut tokio::sync::watch::Receiver<Link>) -> std::io::Result<()> {
    match link.wait_for(|l| *l != Link::Stalled).await {
        Ok(l) if *l == Link::Up => Ok(()),
        _ => Err(cut_off()),
    }
}

/// Resolves once the link is cut (or the proxy is gone).
async fn severed(link: &mut tokio::sync::watch::Receiver<Link>) {
    let _ = link.wait_for(|l| *l == Link::Cut).await;
}

/// Forwards one accepted connection to `target` until either side closes or
/// the link is cut. A connection accepted during a stall is not even passed on
/// until the stall ends.
async fn forward(
    inbound: tokio::net::TcpStream,
    target: String,
    mut link: tokio::sync::watch::Receiver<Link>,
    links: Arc<Links>,
) {
    if passable(&mut link).await.is_err() {
        return;
    }
    let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
        return;
    };
    let (from_client, to_client) = inbound.into_split();
    let (from_server, to_server) = outbound.into_split();
    // The first error (or cut) ends both directions and drops both sockets.
    let _ = tokio::try_join!(
        pump(from_client, to_server, link.clone(), Some(links)),
        pump(from_server, to_client, link, None),
    );
}

/// Copies one direction, passing EOF on as a write shutdown. Bytes read while
/// the link is stalled are held until it is up again; towards the target
/// (`holds` given), a request to hold waits its time first.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut link: tokio::sync::watch::Receiver<Link>,
    holds: Option<Arc<Links>>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => read?,
            () = severed(&mut link) => return Err(cut_off()),
        };
        passable(&mut link).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        if let Some(hold) = holds.as_ref().and_then(|l| l.hold_for(&buf[..n])) {
            tokio::time::sleep(hold).await;
        }
        tokio::select! {
            written = to.write_all(&buf[..n]) => written?,
            () = severed(&mut link) => return Err(cut_off()),
        }
    }
}
