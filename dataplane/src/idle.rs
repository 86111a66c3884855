//! Client connection timers: how long a connection may sit idle between requests (the keep-alive
//! timeout, nginx `keepalive_timeout`) and how long a request head may take (the header read
//! timeout, nginx `client_header_timeout`, against slowloris), for HTTP/1.1 and HTTP/2 alike.
//!
//! A connection is active while a request is in flight, from its head until its response body
//! ends; an active connection is never cut. The first request's head must arrive within the
//! header read timeout of the connection's start. Afterwards the connection may stay idle for the
//! keep-alive timeout; once bytes of a next request arrive, its head must complete within the
//! header read timeout of the first byte. HTTP/2 clients send frames between requests (window
//! updates, pings), so on HTTP/2 only streams count: idle means no stream in flight.
//!
//! Requests only store times and counts; nothing wakes the watchdog. It sleeps until the
//! deadline as things stand, or for the shorter of the two timeouts when there is none (a
//! request in flight): any deadline that arises meanwhile (a request ends, a next head starts)
//! lies at least that far ahead, so none is missed, and a busy keep-alive connection costs no
//! timer or task wakeup per request.
//!
//! An HTTP/1.1 connection idle for [`PARK_AFTER`] (250 ms) after a request without a body is parked: the
//! watchdog asks for it ([`Wake::Park`]), and the next read that would wait fails with
//! [`Parked`] instead, so the HTTP server lets go of the connection (and of its buffers) at a
//! message boundary; `listen` then waits for the socket to become readable with no buffer at all.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::clock::deadline;

/// The two client-side connection timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Longest idle time between requests.
    pub keepalive: Duration,
    /// Longest time for a request head, from the connection's start (first request) or from the
    /// head's first byte.
    pub header_read: Duration,
}

#[derive(Debug)]
struct Shared {
    start: Instant,
    in_flight: AtomicUsize,
    served: AtomicBool,
    /// The connection speaks HTTP/2 (it began with the connection preface).
    h2: AtomicBool,
    /// Milliseconds after `start` when the connection last went idle.
    idle_since: AtomicU64,
    /// Milliseconds after `start`, plus one, when the first byte arrived while idle (0: none).
    head_since: AtomicU64,
    /// The last request ended at a message boundary that may be parked at (no body, no upgrade).
    parkable: AtomicBool,
    /// The watchdog asked the connection to park at its next read that would wait.
    park: AtomicBool,
}

/// How long an HTTP/1.1 connection stays idle before it is parked (its HTTP server state and
/// buffers released until the client sends again). Busy keep-alive connections, whose next
/// request follows within this time, keep theirs and pay nothing per request (their watchdog
/// wakes this often while a request is in flight). Short, so that connections opened in a burst
/// do not all hold buffers at once: freed memory stays with the process.
pub const PARK_AFTER: Duration = Duration::from_millis(250);

/// What the watchdog woke for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Idle too long, or a request head too slow: close the connection.
    Expired,
    /// Idle for [`PARK_AFTER`] after a parkable request: park the connection.
    Park,
}

/// The read error that tells the HTTP server a parked connection is to be let go of (see the
/// module docs); never seen by a client.
#[derive(Debug, thiserror::Error)]
#[error("idle connection parked")]
pub struct Parked;

/// What a connection is doing, shared by its reader, its requests and its watchdog.
#[derive(Clone, Debug)]
pub struct Activity(Arc<Shared>);

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

impl Activity {
    /// A connection starting now.
    pub fn new() -> Activity {
        Activity(Arc::new(Shared {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            h2: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            parkable: AtomicBool::new(false),
            park: AtomicBool::new(false),
        }))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Bytes arrived from the client: while idle, a request head has started.
    pub fn read(&self) {
        let s = &self.0;
        if s.in_flight.load(Ordering::SeqCst) == 0
            && s.head_since.load(Ordering::SeqCst) == 0
            && !s.h2.load(Ordering::SeqCst)
        {
            s.head_since.store(self.now_ms() + 1, Ordering::SeqCst);
        }
    }

    /// The connection speaks HTTP/2: bytes between requests do not start a head.
    pub fn http2(&self) {
        self.0.h2.store(true, Ordering::SeqCst);
        self.0.head_since.store(0, Ordering::SeqCst);
    }

    /// A request head arrived; the connection is active until the returned guard drops.
    pub fn begin(&self) -> Busy {
        self.begin_parkable(false)
    }

    /// [`Activity::begin`] for a request after which the connection may be parked once idle
    /// (`parkable`: it has no body and asks for no upgrade, so the server is at a message
    /// boundary once the response ends).
    pub fn begin_parkable(&self, parkable: bool) -> Busy {
        let s = &self.0;
        s.served.store(true, Ordering::SeqCst);
        s.parkable.store(parkable, Ordering::SeqCst);
        s.park.store(false, Ordering::SeqCst);
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(Some(self.clone()))
    }

    /// Asks the connection to park at its next read that would wait.
    pub fn request_park(&self) {
        self.0.park.store(true, Ordering::SeqCst);
    }

    /// Withdraws a park request (the connection is served again).
    pub fn clear_park(&self) {
        self.0.park.store(false, Ordering::SeqCst);
    }

    /// Whether a read that would wait parks the connection now: asked for, and still idle.
    fn park_due(&self) -> bool {
        let s = &self.0;
        s.park.load(Ordering::SeqCst) && s.in_flight.load(Ordering::SeqCst) == 0
    }

    /// When the connection is to be parked as things stand (`None`: not parkable now, or already
    /// asked to park): `after` past the end of a parkable request, while no next head started.
    fn park_at(&self, after: Duration) -> Option<Instant> {
        let s = &self.0;
        let parkable = s.served.load(Ordering::SeqCst)
            && s.parkable.load(Ordering::SeqCst)
            && !s.h2.load(Ordering::SeqCst)
            && !s.park.load(Ordering::SeqCst)
            && s.in_flight.load(Ordering::SeqCst) == 0
            && s.head_since.load(Ordering::SeqCst) == 0;
        let since = deadline(
            s.start,
            Duration::from_millis(s.idle_since.load(Ordering::SeqCst)),
        );
        parkable.then(|| deadline(since, after))
    }

    /// When the connection is to be closed as things stand (`None`: a request is in flight).
    fn deadline(&self, t: Timeouts) -> Option<Instant> {
        let s = &self.0;
        if s.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        if !s.served.load(Ordering::SeqCst) {
            return Some(deadline(s.start, t.header_read));
        }
        let at = |ms: u64| deadline(s.start, Duration::from_millis(ms));
        Some(match s.head_since.load(Ordering::SeqCst) {
            0 => deadline(at(s.idle_since.load(Ordering::SeqCst)), t.keepalive),
            head => deadline(at(head - 1), t.header_read),
        })
    }

    /// Resolves once the connection has been idle too long, or a request head too slow.
    pub async fn expired(&self, t: Timeouts) {
        self.next(t, None).await;
    }

    /// Resolves once the connection has been idle too long or a request head too slow
    /// ([`Wake::Expired`]), or, with `park_after`, once it has been idle that long after a
    /// parkable request ([`Wake::Park`]).
    pub async fn next(&self, t: Timeouts, park_after: Option<Duration>) -> Wake {
        // A deadline that arises after `now` is at least `check` after it (see the module
        // docs), so waking at `now + check` at the latest never misses one. The same holds for
        // the park time with `park_after`.
        let check = t.keepalive.min(t.header_read);
        let check = park_after.map_or(check, |after| check.min(after));
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        loop {
            let now = Instant::now();
            let mut wake = match self.deadline(t) {
                Some(at) if now >= at => return Wake::Expired,
                Some(at) => at.min(deadline(now, check)),
                None => deadline(now, check),
            };
            if let Some(at) = park_after.and_then(|after| self.park_at(after)) {
                if now >= at {
                    return Wake::Park;
                }
                wake = wake.min(at);
            }
            sleep.as_mut().reset(wake);
            sleep.as_mut().await;
        }
    }
}

/// Marks one request in flight until dropped.
#[derive(Debug)]
pub struct Busy(Option<Activity>);

impl Busy {
    /// A mark of no request (counts nothing).
    pub fn none() -> Busy {
        Busy(None)
    }

    /// A response body that keeps the request in flight until it ends or is dropped.
    pub fn body<B>(self, inner: B) -> BusyBody<B> {
        BusyBody { inner, busy: self }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(activity) = self.0.take() {
            let s = &activity.0;
            // Idle from now, unless another request is still in flight (HTTP/2); the times are
            // written before the count drops so the watchdog never sees stale ones.
            s.idle_since.store(activity.now_ms(), Ordering::SeqCst);
            s.head_since.store(0, Ordering::SeqCst);
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A response body that holds its request's [`Busy`] mark.
#[derive(Debug)]
pub struct BusyBody<B> {
    inner: B,
    busy: Busy,
}

impl<B: Body + Unpin> Body for BusyBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // Done: idle from now even if the connection keeps the body around.
            drop(std::mem::replace(&mut this.busy, Busy(None)));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The waker of a connection task's side futures (its watchdog timer, the drain signal): a wake
/// marks them due, then wakes the task. The task polls them only when due instead of on every
/// wake-up (most are its socket's, several per request).
#[derive(Debug, Default)]
pub struct SideWake {
    due: AtomicBool,
    task: futures_util::task::AtomicWaker,
}

impl SideWake {
    /// A side waker, due (its futures are polled at the first poll).
    pub fn new() -> Arc<SideWake> {
        let side = SideWake::default();
        side.due.store(true, Ordering::SeqCst);
        Arc::new(side)
    }

    /// Whether the side futures are due a poll (clears it), the task's waker registered for the
    /// next wake.
    pub fn take_due(&self, task: &std::task::Waker) -> bool {
        self.task.register(task);
        self.due.swap(false, Ordering::SeqCst)
    }

    /// Marks the side futures due without a wake (their state changed within the task's poll).
    pub fn mark_due(&self) {
        self.due.store(true, Ordering::SeqCst);
    }
}

impl std::task::Wake for SideWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.due.store(true, Ordering::SeqCst);
        self.task.wake();
    }
}

/// A client stream that reports arriving bytes to its connection's [`Activity`], and parks the
/// connection when asked to (see the module docs).
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    activity: Activity,
    /// No byte has arrived yet.
    first: bool,
    /// Bytes were handed to `inner` and not yet flushed by it.
    unflushed: bool,
    /// A read failed with [`Parked`]: the HTTP server is letting go; its shutdown must not
    /// reach the stream.
    parked: bool,
}

/// How an HTTP/2 connection (prior knowledge, or ALPN `h2`) begins.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl<S> Watched<S> {
    /// `inner`, reporting to `activity`.
    pub fn new(inner: S, activity: Activity) -> Watched<S> {
        Watched {
            inner,
            activity,
            first: true,
            unflushed: false,
            parked: false,
        }
    }

    /// Whether a read failed with [`Parked`] (the HTTP server let go of an idle connection).
    pub fn is_parked(&self) -> bool {
        self.parked
    }

    /// Served again after being parked: reads and shutdowns reach the stream as before.
    pub fn unpark(&mut self) {
        self.parked = false;
        self.activity.clear_park();
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let arrived = &buf.filled()[before..];
        if !arrived.is_empty() {
            if this.first {
                this.first = false;
                let n = arrived.len().min(H2_PREFACE.len());
                if n >= 3 && arrived[..n] == H2_PREFACE[..n] {
                    this.activity.http2();
                }
            }
            this.activity.read();
        }
        if polled.is_pending() && !this.unflushed && this.activity.park_due() {
            this.parked = true;
            return Poll::Ready(Err(io::Error::other(Parked)));
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.unflushed = true;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.unflushed = true;
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            this.unflushed = false;
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.parked {
            // The HTTP server ends a parked connection: the stream stays open for the next one.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        keepalive: Duration::from_secs(75),
        header_read: Duration::from_secs(60),
    };

    /// How long until `expired` resolves, from now (paused time), or `None` within an hour.
    async fn expires_in(activity: &Activity) -> Option<Duration> {
        let start = Instant::now();
        tokio::time::timeout(Duration::from_secs(3600), activity.expired(T))
            .await
            .ok()
            .map(|()| start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn first_head_gets_the_header_timeout_from_the_start() {
        let activity = Activity::new();
        assert_eq!(expires_in(&activity).await, Some(T.header_read));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_between_requests_gets_the_keepalive_timeout() {
        let activity = Activity::new();
        drop(activity.begin());
        assert_eq!(expires_in(&activity).await, Some(T.keepalive));
    }

    #[tokio::test(start_paused = true)]
    async fn a_started_head_gets_the_header_timeout_from_its_first_byte() {
        let activity = Activity::new();
        drop(activity.begin());
        tokio::time::advance(Duration::from_secs(10)).await;
        activity.read();
        assert_eq!(expires_in(&activity).await, Some(T.header_read));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_started_while_the_watchdog_sleeps_is_not_given_longer() {
        // The watchdog is asleep (idle: keep-alive deadline at 75 s) when the next head starts
        // at 10 s; nothing wakes it, yet it fires at 10 s + the header timeout, not at 75 s.
        let activity = Activity::new();
        drop(activity.begin());
        let start = Instant::now();
        let waiter = activity.clone();
        let expiry = tokio::spawn(async move {
            waiter.expired(T).await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        activity.read();
        let expired_at = expiry.await.unwrap();
        assert_eq!(expired_at - start, Duration::from_secs(10) + T.header_read);
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_between_streams_keep_the_keepalive_timeout() {
        let activity = Activity::new();
        let mut io = Watched::new(H2_PREFACE, activity.clone());
        let mut buf = [0u8; 64];
        tokio::io::AsyncReadExt::read(&mut io, &mut buf)
            .await
            .unwrap();
        drop(activity.begin());
        activity.read();
        assert_eq!(expires_in(&activity).await, Some(T.keepalive));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_are_never_cut_and_the_idle_time_restarts_after() {
        let activity = Activity::new();
        let first = activity.begin();
        let second = activity.begin();
        assert_eq!(expires_in(&activity).await, None);
        drop(first);
        assert_eq!(expires_in(&activity).await, None, "one still in flight");
        let start = Instant::now();
        let waiter = activity.clone();
        let expiry = tokio::spawn(async move {
            waiter.expired(T).await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(second);
        let expired_at = expiry.await.unwrap();
        assert_eq!(expired_at - start, T.keepalive + Duration::from_secs(5));
    }
}
