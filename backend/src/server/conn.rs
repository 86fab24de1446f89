//! Accepting connections under limits: every connection has a
//! header-read timeout (hyper's: a connection that has not sent a complete
//! request head within `--header-timeout-secs`, an idle keep-alive one
//! included, is closed), and the connections are counted in two pools.
//!
//! A connection starts *unauthenticated* and becomes *authorised* when one
//! of its requests presents the token (or the read cookie). On loopback the
//! attacker and the user share 127.0.0.1, so a per-address cap would lock the
//! user out with the attacker; instead at most a quarter of
//! `--max-connections` may be unauthenticated: a new connection beyond that
//! closes the oldest unauthenticated one (whose slot it takes), so a flood
//! of half-open connections only ever evicts itself, and the rest of the
//! slots are kept for authorised connections. `--max-connections` is
//! lowered to fit the open-file limit (raised to its hard limit at start),
//! keeping [`FD_RESERVE`] descriptors for the database, uploads, downloads
//! and jobs; when `accept` still fails for lack of descriptors, the oldest
//! unauthenticated connection is closed too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use super::{AppStateRef, Presented};

/// File descriptors kept for everything but connections.
pub const FD_RESERVE: u64 = 64;

/// Raises the soft open-file limit to the hard one; returns the soft limit now.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit read and write a plain struct.
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit { rlim_cur: r.rlim_max.min(1 << 20), rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r.rlim_cur = want.rlim_cur;
            }
        }
        r.rlim_cur
    }
}

/// The connection caps: (all connections, unauthenticated ones).
pub fn caps(max_connections: usize, fd_limit: u64) -> (usize, usize) {
    let fit = fd_limit.saturating_sub(FD_RESERVE).max(8) as usize;
    let total = max_connections.clamp(8, fit.max(8));
    (total, (total / 4).max(2))
}

struct Conn {
    authorised: AtomicBool,
    close: Notify,
}

#[derive(Default)]
struct Pools {
    next: u64,
    /// Unauthenticated connections by age (id order).
    unauth: BTreeMap<u64, Arc<Conn>>,
    /// Authorised connections.
    auth: BTreeMap<u64, Arc<Conn>>,
}

/// The connection registry and its caps.
pub struct Limits {
    pools: Mutex<Pools>,
    total: usize,
    unauth: usize,
}

impl Limits {
    /// Caps of `total` connections of which `unauth` may be unauthenticated.
    pub fn new(total: usize, unauth: usize) -> Arc<Limits> {
        Arc::new(Limits { pools: Mutex::new(Pools::default()), total, unauth })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pools> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the oldest unauthenticated connection; whether there was one.
    fn evict_oldest(p: &mut Pools) -> bool {
        match p.unauth.pop_first() {
            Some((_, c)) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }

    /// Admits a new connection (evicting as the caps say), or `None` when
    /// every slot is held by authorised connections.
    fn admit(&self) -> Option<(u64, Arc<Conn>)> {
        let mut p = self.lock();
        while p.unauth.len() >= self.unauth || p.unauth.len() + p.auth.len() >= self.total {
            if !Self::evict_oldest(&mut p) {
                return None;
            }
        }
        p.next += 1;
        let id = p.next;
        let c = Arc::new(Conn { authorised: AtomicBool::new(false), close: Notify::new() });
        p.unauth.insert(id, c.clone());
        Some((id, c))
    }

    /// Moves connection `id` to the authorised pool (once).
    fn promote(&self, id: u64, c: &Conn) {
        if c.authorised.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut p = self.lock();
        if let Some(c) = p.unauth.remove(&id) {
            p.auth.insert(id, c);
        }
    }

    fn remove(&self, id: u64) {
        let mut p = self.lock();
        p.unauth.remove(&id);
        p.auth.remove(&id);
    }

    /// (unauthenticated, authorised) connections open now.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        let p = self.lock();
        (p.unauth.len(), p.auth.len())
    }
}

/// Resolves once `rx` holds `true`.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Serves `app` on `listener` until `shutdown` turns true, then closes the
/// connections gracefully (in-flight responses finish; at most 10 s).
pub async fn serve(
    st: AppStateRef,
    listener: TcpListener,
    app: Router,
    limits: Arc<Limits>,
    shutdown: watch::Receiver<bool>,
) {
    let header_timeout = Duration::from_secs(st.args.header_timeout_secs.max(1));
    let (done_tx, mut done_rx) = watch::channel(0usize);
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stopped(shutdown.clone()) => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors (EMFILE/ENFILE) or a transient error:
                // free the oldest unauthenticated slot and retry shortly.
                if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
                    Limits::evict_oldest(&mut limits.lock());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let Some((id, conn)) = limits.admit() else {
            drop(stream); // every slot is an authorised connection's
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (st2, app, limits2, conn2, shutdown2) =
            (st.clone(), app.clone(), limits.clone(), conn.clone(), shutdown.clone());
        let (open2, done2, limits3) = (open.clone(), done_tx.clone(), limits.clone());
        open.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                if matches!(st2.credentials.presented(req.headers()), Presented::Token | Presented::ReadCookie) {
                    limits2.promote(id, &conn2);
                }
                let app = app.clone();
                async move {
                    use tower::ServiceExt;
                    app.oneshot(req.map(axum::body::Body::new)).await
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true);
            let served = builder.serve_connection(TokioIo::new(stream), svc).with_upgrades();
            tokio::pin!(served);
            tokio::select! {
                _ = served.as_mut() => {}
                _ = conn.close.notified() => {}
                _ = stopped(shutdown2) => {
                    served.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(10), served.as_mut()).await;
                }
            }
            limits3.remove(id);
            let n = open2.fetch_sub(1, Ordering::SeqCst) - 1;
            let _ = done2.send(n);
        });
    }
    drop(listener);
    // Wait for the connections to finish (their tasks see the shutdown).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    while open.load(Ordering::SeqCst) > 0 {
        if tokio::time::timeout_at(deadline, done_rx.changed()).await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_fit_the_descriptors() {
        assert_eq!(caps(1024, 20000), (1024, 256));
        assert_eq!(caps(1024, 256), (192, 48));
        assert_eq!(caps(1024, 10), (8, 2));
    }

    #[test]
    fn unauthenticated_connections_evict_each_other_never_the_authorised() {
        let l = Limits::new(6, 2);
        let (a, ca) = l.admit().unwrap();
        l.promote(a, &ca);
        let (_b, cb) = l.admit().unwrap();
        let (_c, _cc) = l.admit().unwrap();
        assert_eq!(l.counts(), (2, 1));
        // A third unauthenticated one evicts the oldest (b), not a.
        let (_d, _) = l.admit().unwrap();
        assert_eq!(l.counts(), (2, 1));
        assert!(!ca.authorised.load(Ordering::Relaxed) || l.lock().auth.contains_key(&a));
        let _ = cb; // b was told to close
        let l = Limits::new(2, 2);
        let (x, cx) = l.admit().unwrap();
        l.promote(x, &cx);
        let (y, cy) = l.admit().unwrap();
        l.promote(y, &cy);
        assert!(l.admit().is_none(), "every slot authorised: the new one is refused");
    }
}
