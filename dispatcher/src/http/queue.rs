//! Per-backend request slots and the queue in front of them: HAProxy's `maxconn`,
//! `maxqueue` and `timeout queue`.
//!
//! A backend with `maxconn` has at most that many requests in flight over all workers
//! (and, across a reload, over both generations: the slots are shared). A request for a
//! session whose owner is full waits in that backend's queue — it never goes to another
//! server — for at most `http.queue_timeout`; the queue holds at most `maxqueue`
//! requests. A request without a session is balanced to a server with room (see
//! `route`), and queues only when every server is full. Waiters are served in arrival
//! order: a newcomer takes a free slot directly only while nobody is queued.

use std::{
    pin::pin,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use crate::state::Histogram;

/// Why a request got no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `maxqueue` requests were waiting already.
    QueueFull,
    /// No slot came free within the queue timeout.
    Timeout,
}

pub struct Slots {
    in_flight: AtomicU64,
    /// 0: no limit.
    max: AtomicU64,
    max_queue: AtomicU64,
    queued: AtomicU64,
    freed: Notify,
    /// How long requests that queued waited (served or not).
    pub waits: Histogram,
    /// Requests that had to queue.
    pub queued_total: AtomicU64,
    pub refused_full: AtomicU64,
    pub refused_timeout: AtomicU64,
}

/// A request's slot on a backend, given back when dropped.
pub struct Slot<'a> {
    slots: &'a Slots,
    /// It queued for it.
    pub waited: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.in_flight.fetch_sub(1, Ordering::AcqRel);
        // One waiter may take it (a waiter that gave up passes the wake-up on).
        self.slots.freed.notify_one();
    }
}

impl Slots {
    /// `max`: `None` for no limit.
    pub fn new(max: Option<u64>, max_queue: u64) -> Slots {
        Slots {
            in_flight: AtomicU64::new(0),
            max: AtomicU64::new(max.unwrap_or(0)),
            max_queue: AtomicU64::new(max_queue),
            queued: AtomicU64::new(0),
            freed: Notify::new(),
            waits: Histogram::default(),
            queued_total: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            refused_timeout: AtomicU64::new(0),
        }
    }

    /// A reload's limits; requests in flight keep their slots, waiters look again.
    pub fn set_limits(&self, max: Option<u64>, max_queue: u64) {
        self.max.store(max.unwrap_or(0), Ordering::Release);
        self.max_queue.store(max_queue, Ordering::Release);
        self.freed.notify_waiters();
    }

    pub fn max(&self) -> Option<u64> {
        Some(self.max.load(Ordering::Acquire)).filter(|&m| m > 0)
    }

    pub fn max_queue(&self) -> u64 {
        self.max_queue.load(Ordering::Acquire)
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Acquire)
    }

    /// A new request would get a slot at once (the balancer's test).
    pub fn has_room(&self) -> bool {
        self.max().is_none_or(|m| self.in_flight() < m && self.queued() == 0)
    }

    fn try_take(&self) -> bool {
        let mut cur = self.in_flight.load(Ordering::Acquire);
        loop {
            if self.max().is_some_and(|m| cur >= m) {
                return false;
            }
            match self.in_flight.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// A slot now, or after queueing for at most `timeout`.
    pub async fn take(&self, timeout: Duration) -> Result<Slot<'_>, Refused> {
        if self.queued() == 0 && self.try_take() {
            return Ok(Slot { slots: self, waited: false });
        }
        // Join the queue if it has room (the count is taken first, then checked, so that
        // concurrent arrivals cannot overfill it).
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.max_queue() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.refused_full.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::QueueFull);
        }
        let _in_queue = crate::http::Counted(&self.queued);
        self.queued_total.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let deadline = tokio::time::Instant::from_std(start + timeout);
        loop {
            let mut freed = pin!(self.freed.notified());
            freed.as_mut().enable();
            if self.try_take() {
                self.waits.record(start.elapsed());
                return Ok(Slot { slots: self, waited: true });
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                self.waits.record(start.elapsed());
                self.refused_timeout.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Timeout);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn at_most_max_in_flight_then_a_bounded_queue_in_order() {
        let s = Arc::new(Slots::new(Some(2), 2));
        let a = s.take(Duration::from_secs(1)).await.unwrap();
        let _b = s.take(Duration::from_secs(1)).await.unwrap();
        assert!(!s.has_room());
        // Two wait, the third is refused at once.
        let (s1, s2) = (s.clone(), s.clone());
        let w1 = tokio::spawn(async move { s1.take(Duration::from_secs(5)).await.map(|_| Instant::now()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let w2 = tokio::spawn(async move { s2.take(Duration::from_secs(5)).await.map(|_| Instant::now()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(s.queued(), 2);
        assert_eq!(s.take(Duration::from_secs(5)).await.err(), Some(Refused::QueueFull));
        drop(a);
        let t1 = w1.await.unwrap().unwrap();
        // w1's slot was dropped with its task: w2 gets one too, after w1 (arrival order).
        let t2 = w2.await.unwrap().unwrap();
        assert!(t1 <= t2);
        assert_eq!((s.queued(), s.in_flight()), (0, 1));
        assert_eq!(s.queued_total.load(Ordering::Relaxed), 2);
        assert_eq!(s.refused_full.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_waiter_gives_up_at_the_timeout_and_a_raised_limit_frees_waiters() {
        let s = Arc::new(Slots::new(Some(1), 10));
        let _a = s.take(Duration::from_secs(1)).await.unwrap();
        let t = Instant::now();
        assert_eq!(s.take(Duration::from_millis(100)).await.err(), Some(Refused::Timeout));
        assert!(t.elapsed() >= Duration::from_millis(100) && t.elapsed() < Duration::from_secs(1));
        assert_eq!(s.queued(), 0, "the queue forgets a waiter that left");
        let s1 = s.clone();
        let w = tokio::spawn(async move { s1.take(Duration::from_secs(5)).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.set_limits(Some(2), 10);
        assert!(w.await.unwrap(), "a reload that raises maxconn serves the queue");
        s.set_limits(None, 10);
        assert!(s.has_room());
    }

    #[tokio::test]
    async fn without_a_limit_nothing_waits_and_no_queue_means_refused_at_once() {
        let s = Slots::new(None, 0);
        let held: Vec<_> = futures_take(&s, 100).await;
        assert_eq!(held.len(), 100);
        let s = Slots::new(Some(1), 0);
        let _a = s.take(Duration::from_secs(1)).await.unwrap();
        assert_eq!(s.take(Duration::from_secs(1)).await.err(), Some(Refused::QueueFull));
    }

    async fn futures_take(s: &Slots, n: usize) -> Vec<Slot<'_>> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(s.take(Duration::ZERO).await.unwrap());
        }
        v
    }
}
