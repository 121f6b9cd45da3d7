//! Per-backend request slots and the queue in front of them: HAProxy's `maxconn`,
//! `maxqueue` and `timeout queue`.
//!
//! A backend with `maxconn` has at most that many requests in flight over all workers
//! (and, across a reload, over both generations: the slots are shared). A request for a
//! session whose owner is full waits in that backend's queue — it never goes to another
//! server — for at most `http.queue_timeout`; the queue holds at most `maxqueue`
//! requests. A request without a session is balanced to a server with room (see
//! `route`), and queues only when every server is full. Waiters are served strictly in
//! arrival order: a freed slot is handed to the oldest waiter, and a newcomer takes a
//! free slot directly only while nobody is queued. A request that waited is routed again
//! when it gets its slot if its server's state changed meanwhile (see `proxy`).

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::Instant,
};

use tokio::sync::oneshot;

use crate::metrics::Histogram;

/// Why a request got no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// `maxqueue` requests were waiting already.
    QueueFull,
    /// No slot came free within the queue timeout.
    Timeout,
    /// Its server left while it waited (set by the request path, not by the queue).
    Left,
}

/// The queue, in arrival order: a freed slot is handed to its head.
struct Waiters {
    next_id: u64,
    list: VecDeque<(u64, oneshot::Sender<()>)>,
}

pub struct Slots {
    /// Slots taken (the waiters a slot was handed to included).
    in_flight: AtomicU64,
    /// 0: no limit.
    max: AtomicU64,
    max_queue: AtomicU64,
    /// `waiters.list.len()`, for readers that take no lock (the balancer).
    queued: AtomicU64,
    waiters: Mutex<Waiters>,
    /// How long requests that queued waited (served or not).
    pub waits: Histogram,
    /// Requests that had to queue.
    pub queued_total: AtomicU64,
    pub refused_full: AtomicU64,
    pub refused_timeout: AtomicU64,
    /// Answered 503 because the server left while they waited and rerouting was used up
    /// (counted by the request path).
    pub refused_left: AtomicU64,
}

/// A request's slot on a backend, given back (or handed to the next waiter) when dropped.
pub struct Slot<'a> {
    slots: &'a Slots,
    /// It queued for it.
    pub waited: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.release();
    }
}

/// A place in the queue; leaving it (given up, or the request dropped) takes it out, and
/// a slot handed to it meanwhile goes on to the next waiter.
struct Place<'a> {
    slots: &'a Slots,
    id: u64,
    rx: oneshot::Receiver<()>,
    /// Served or refused: nothing left to undo.
    done: bool,
}

impl Place<'_> {
    /// Out of the queue: `true` if a slot was handed over first (it is ours then).
    fn leave(&mut self) -> bool {
        let mut w = self.slots.waiters.lock().unwrap();
        if let Some(i) = w.list.iter().position(|(id, _)| *id == self.id) {
            w.list.remove(i);
            self.slots.queued.store(w.list.len() as u64, Ordering::Release);
            return false;
        }
        // Not in the queue any more: a slot was sent (under the lock, so it is there).
        self.rx.try_recv().is_ok()
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
            waiters: Mutex::new(Waiters { next_id: 0, list: VecDeque::new() }),
            waits: Histogram::default(),
            queued_total: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            refused_timeout: AtomicU64::new(0),
            refused_left: AtomicU64::new(0),
        }
    }

    /// A reload's limits; requests in flight keep their slots (a lowered limit takes
    /// effect as they finish), waiters are served as far as a raised limit allows.
    pub fn set_limits(&self, max: Option<u64>, max_queue: u64) {
        let mut w = self.waiters.lock().unwrap();
        self.max.store(max.unwrap_or(0), Ordering::Release);
        self.max_queue.store(max_queue, Ordering::Release);
        self.serve(&mut w);
    }

    /// Hands free slots to the oldest waiters (with the lock held).
    fn serve(&self, w: &mut Waiters) {
        while !w.list.is_empty() && self.max().is_none_or(|m| self.in_flight() < m) {
            if let Some((_, tx)) = w.list.pop_front() {
                if tx.send(()).is_ok() {
                    self.in_flight.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
        self.queued.store(w.list.len() as u64, Ordering::Release);
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

    /// A slot freed: to the oldest waiter if the limit allows, else back.
    fn release(&self) {
        if self.max().is_none() && self.queued() == 0 {
            // No limit: no queue to serve (one that a reload just lifted is served by it).
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            if self.queued() > 0 {
                // A reload set a limit meanwhile and someone queued behind this slot.
                self.serve(&mut self.waiters.lock().unwrap());
            }
            return;
        }
        let mut w = self.waiters.lock().unwrap();
        // Over a lowered limit: the slot is retired, not handed on.
        if self.max().is_none_or(|m| self.in_flight() <= m) {
            while let Some((_, tx)) = w.list.pop_front() {
                // A waiter whose request went away (its receiver dropped) is skipped.
                if tx.send(()).is_ok() {
                    self.queued.store(w.list.len() as u64, Ordering::Release);
                    return;
                }
            }
            self.queued.store(0, Ordering::Release);
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// A slot now, or after queueing (in arrival order) until `deadline`.
    pub async fn take(&self, deadline: Instant) -> Result<Slot<'_>, Refused> {
        if self.max().is_none() {
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            return Ok(Slot { slots: self, waited: false });
        }
        let mut place = {
            let mut w = self.waiters.lock().unwrap();
            // Nobody before it: a free slot is its (the limit read again under the lock: a
            // reload may have changed it).
            if w.list.is_empty() && self.max().is_none_or(|m| self.in_flight() < m) {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                return Ok(Slot { slots: self, waited: false });
            }
            if w.list.len() as u64 >= self.max_queue() {
                drop(w);
                self.refused_full.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::QueueFull);
            }
            let (tx, rx) = oneshot::channel();
            let id = w.next_id;
            w.next_id += 1;
            w.list.push_back((id, tx));
            self.queued.store(w.list.len() as u64, Ordering::Release);
            Place { slots: self, id, rx, done: false }
        };
        self.queued_total.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let served = match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), &mut place.rx).await {
            Ok(Ok(())) => true,
            // Timed out (or, impossibly, the sender dropped unsent): out of the queue,
            // unless a slot arrived in the meantime.
            _ => place.leave(),
        };
        place.done = true;
        self.waits.record(start.elapsed());
        if served {
            Ok(Slot { slots: self, waited: true })
        } else {
            self.refused_timeout.fetch_add(1, Ordering::Relaxed);
            Err(Refused::Timeout)
        }
    }
}

impl Drop for Place<'_> {
    /// The request went away while queued: out of the queue, and a slot handed to it
    /// goes on.
    fn drop(&mut self) {
        if !self.done && self.leave() {
            self.slots.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use super::*;

    fn after(d: Duration) -> Instant {
        Instant::now() + d
    }

    #[tokio::test]
    async fn at_most_max_in_flight_then_a_bounded_queue_in_order() {
        let s = Arc::new(Slots::new(Some(2), 2));
        let a = s.take(after(Duration::from_secs(1))).await.unwrap();
        let _b = s.take(after(Duration::from_secs(1))).await.unwrap();
        assert!(!s.has_room());
        // Two wait, the third is refused at once.
        let (s1, s2) = (s.clone(), s.clone());
        let w1 = tokio::spawn(async move { s1.take(after(Duration::from_secs(5))).await.map(|_| Instant::now()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let w2 = tokio::spawn(async move { s2.take(after(Duration::from_secs(5))).await.map(|_| Instant::now()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(s.queued(), 2);
        assert_eq!(s.take(after(Duration::from_secs(5))).await.err(), Some(Refused::QueueFull));
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
        let _a = s.take(after(Duration::from_secs(1))).await.unwrap();
        let t = Instant::now();
        assert_eq!(s.take(after(Duration::from_millis(100))).await.err(), Some(Refused::Timeout));
        assert!(t.elapsed() >= Duration::from_millis(100) && t.elapsed() < Duration::from_secs(1));
        assert_eq!(s.queued(), 0, "the queue forgets a waiter that left");
        let s1 = s.clone();
        let w = tokio::spawn(async move { s1.take(after(Duration::from_secs(5))).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.set_limits(Some(2), 10);
        assert!(w.await.unwrap(), "a reload that raises maxconn serves the queue");
        s.set_limits(None, 10);
        assert!(s.has_room());
    }

    #[tokio::test]
    async fn strictly_in_arrival_order_and_a_request_that_went_away_is_skipped() {
        let s = Arc::new(Slots::new(Some(1), 10));
        let first = s.take(after(Duration::from_secs(1))).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (s, order) = (s.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let slot = s.take(after(Duration::from_secs(5))).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(slot);
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(s.queued(), 5);
        tasks.remove(2).abort();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(s.queued(), 4, "a request that went away leaves the queue");
        // A newcomer does not take a slot before those queued, even at the moment one
        // frees: it queues behind them (and gives up at its deadline).
        assert_eq!(s.take(after(Duration::ZERO)).await.err(), Some(Refused::Timeout));
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 3, 4]);
        assert_eq!((s.in_flight(), s.queued()), (0, 0));
    }

    #[tokio::test]
    async fn a_lowered_limit_retires_slots_before_serving_the_queue() {
        let s = Arc::new(Slots::new(Some(2), 10));
        let a = s.take(after(Duration::from_secs(1))).await.unwrap();
        let b = s.take(after(Duration::from_secs(1))).await.unwrap();
        let s1 = s.clone();
        let w = tokio::spawn(async move { s1.take(after(Duration::from_secs(5))).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.set_limits(Some(1), 10);
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!((s.in_flight(), s.queued()), (1, 1), "the freed slot is retired");
        drop(b);
        assert!(w.await.unwrap());
        assert_eq!((s.in_flight(), s.queued()), (0, 0));
    }

    #[tokio::test]
    async fn without_a_limit_nothing_waits_and_no_queue_means_refused_at_once() {
        let s = Slots::new(None, 0);
        let held: Vec<_> = futures_take(&s, 100).await;
        assert_eq!(held.len(), 100);
        let s = Slots::new(Some(1), 0);
        let _a = s.take(after(Duration::from_secs(1))).await.unwrap();
        assert_eq!(s.take(after(Duration::from_secs(1))).await.err(), Some(Refused::QueueFull));
    }

    async fn futures_take(s: &Slots, n: usize) -> Vec<Slot<'_>> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(s.take(after(Duration::ZERO)).await.unwrap());
        }
        v
    }
}
