//! What an HTTP/1.1 server of nodewarden holds any client to: connections
//! at once, how long a request head may take to arrive, how large it may be,
//! and how long an answer may wait for the client to read it. The endpoints
//! (`/healthz`, `/readyz`, `/metrics`) and the admission webhook both serve
//! through it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// hyper's smallest read buffer: `max_buf_size` panics below it.
const MIN_READ_BUFFER: usize = 8 * 1024;

/// How long to wait after a failed accept (out of file descriptors, say)
/// before the next, so the loop does not spin on the error.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The limits one server holds every connection to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections served at once. Past it a new connection is closed at
    /// once, not queued: waiting ones would hold descriptors and tasks too.
    pub max_connections: usize,
    /// How long a request head may take to arrive. hyper starts this timer
    /// again when a kept-alive connection goes idle after an answer, so it
    /// is also how long a connection may sit idle.
    pub header_read_timeout: Duration,
    /// The largest request head (start line and headers); hyper answers 431
    /// past it.
    pub max_header_bytes: usize,
    /// The connection's read buffer (hyper's `max_buf_size`, at least 8 KiB):
    /// what one connection buffers at most, and the largest body chunk.
    pub read_buffer_bytes: usize,
    /// How long writing an answer may wait for the client to read it.
    pub write_timeout: Duration,
}

impl ConnLimits {
    /// The endpoints (`/healthz`, `/readyz`, `/metrics`): kubelet probes (a
    /// new connection each) and a Prometheus or two, whose requests are a
    /// head of a few hundred bytes and no body. Prometheus reconnects when
    /// its scrape interval is longer than the idle timeout, which costs a
    /// TCP handshake.
    pub const ENDPOINTS: ConnLimits = ConnLimits {
        max_connections: 64,
        header_read_timeout: Duration::from_secs(10),
        max_header_bytes: 16 * 1024,
        read_buffer_bytes: 16 * 1024,
        write_timeout: Duration::from_secs(10),
    };

    /// hyper's HTTP/1.1 server held to these limits.
    pub fn http1(&self) -> http1::Builder {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            .max_header_size(self.max_header_bytes)
            .max_buf_size(self.read_buffer_bytes.max(MIN_READ_BUFFER));
        builder
    }

    /// `stream` for hyper, its writes timed out after `write_timeout`.
    pub fn io<S>(&self, stream: S) -> TokioIo<WriteTimeout<S>> {
        TokioIo::new(WriteTimeout::new(stream, self.write_timeout))
    }
}

/// A stream whose write fails with `TimedOut` once it has waited `timeout`
/// for the peer to read: a client that stops reading its answer would
/// otherwise hold the connection for ever.
#[derive(Debug)]
pub struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Set while a write waits; cleared when one goes through.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    /// `inner`, its writes timed out after `timeout`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        WriteTimeout {
            inner,
            timeout,
            stalled: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> WriteTimeout<S> {
    /// `write` on the inner stream, failed once it has been pending for `timeout`.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(done) = write(Pin::new(&mut self.inner), cx) {
            self.stalled = None;
            return Poll::Ready(done);
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.stalled = None;
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the peer read nothing for {timeout:?}"),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.timed(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.timed(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.timed(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.timed(cx, |s, cx| s.poll_shutdown(cx))
    }
}

/// Which of a connection's timeouts ended it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// No complete request head within `header_read_timeout` (or idle that long).
    HeaderRead,
    /// The client did not read an answer within `write_timeout`.
    Write,
}

/// Which timeout of [`ConnLimits`] ended a connection with `error`, if one did.
pub fn timed_out(error: &hyper::Error) -> Option<Timeout> {
    if error.is_timeout() {
        return Some(Timeout::HeaderRead);
    }
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return Some(Timeout::Write);
        }
        source = e.source();
    }
    None
}

/// The connections a server holds at once.
#[derive(Clone, Debug)]
pub struct Slots(Arc<Semaphore>);

impl Slots {
    /// `max` slots.
    pub fn new(max: usize) -> Slots {
        Slots(Arc::new(Semaphore::new(max)))
    }

    /// A slot for one more connection, held until dropped; None when every
    /// slot is taken.
    pub fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// The next connection of `listener`, or None once `shutdown` is cancelled.
pub async fn accept(listener: &TcpListener, shutdown: &CancellationToken) -> Option<TcpStream> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => return Some(stream),
                Err(e) => {
                    let addr = listener.local_addr().ok();
                    tracing::warn!(?addr, error = %e, "accepting a connection failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_run_out_and_come_back() {
        let slots = Slots::new(2);
        let first = slots.take().expect("a first slot");
        let _second = slots.take().expect("a second slot");
        assert!(slots.take().is_none(), "no third slot");
        drop(first);
        assert!(
            slots.take().is_some(),
            "a slot is free again once a connection ends"
        );
    }

    /// A client that does not read: the write stalls, then fails with
    /// `TimedOut` (what `timed_out` finds under hyper's error); one that
    /// reads is written to as before.
    #[tokio::test]
    async fn a_write_the_client_does_not_read_times_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut io = WriteTimeout::new(ours, Duration::from_millis(200));
        io.write_all(&[b'x'; 64])
            .await
            .expect("room for the first 64 bytes");
        let mut read = [0u8; 64];
        theirs.read_exact(&mut read).await.expect("reading them");
        io.write_all(&[b'y'; 64]).await.expect("room again once read");
        let error = tokio::time::timeout(Duration::from_secs(30), io.write_all(&[b'z'; 64]))
            .await
            .expect("the write timeout ends the stalled write")
            .expect_err("nobody reads: the write fails");
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
    }
}
