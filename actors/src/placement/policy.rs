//! D2/N2: which replica (a worker on a device) or node serves a request, one policy for both.
//! In order (SGLang's cache-aware rule):
//! 1. Session affinity: a session's turns go where its KV is pinned, while that target is up.
//! 2. Load balance: when the load is imbalanced (the busiest target holds more than `balance_abs`
//!    requests more than the idlest *and* more than `balance_rel` times as many), the least
//!    loaded target.
//! 3. Cached prefix: the target whose prefix tree holds the longest prefix of the prompt, when
//!    that covers at least `cache_threshold` of it.
//! 4. Otherwise the least loaded target (ties: the one holding the fewest cached tokens, which
//!    has the most room).
//!
//! That is `Routing::CacheAware`, the default. `LeastLoaded` skips step 3; `RoundRobin` (what
//! a plain load balancer does, the baseline) takes the available targets in turn.
//!
//! The policy is pure: the caller owns it, passes each target's load, and acts on the choice.

use std::collections::HashMap;
use std::hash::Hash;

use super::prefix::PrefixTree;

/// The policy's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlacementConfig {
    /// Imbalance needs both: a difference of more than this many requests...
    pub balance_abs: usize,
    /// ...and the busiest holding more than this many times the idlest's load.
    pub balance_rel: f64,
    /// Share of the prompt a target's cached prefix must cover to be chosen for it.
    pub cache_threshold: f64,
    /// Tokens each target's prefix tree keeps (least recently used trimmed beyond).
    pub tree_tokens: usize,
    /// Sessions remembered (the least recently placed forgotten beyond).
    pub max_sessions: usize,
    pub routing: Routing,
}

/// Which rules place a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// Session, load balance, cached prefix, least loaded.
    #[default]
    CacheAware,
    /// Session, then least loaded.
    LeastLoaded,
    /// The available targets in turn, whatever the session or the prompt.
    RoundRobin,
}

impl std::str::FromStr for Routing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cache_aware" => Ok(Self::CacheAware),
            "least_loaded" => Ok(Self::LeastLoaded),
            "round_robin" => Ok(Self::RoundRobin),
            _ => Err(format!("unknown routing '{s}': expected cache_aware, least_loaded or round_robin")),
        }
    }
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            balance_abs: 8,
            balance_rel: 1.5,
            cache_threshold: 0.5,
            tree_tokens: 1 << 20,
            max_sessions: 1 << 16,
            routing: Routing::CacheAware,
        }
    }
}

/// A target's state as the caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Requests it holds (running and waiting), plus those routed to it it has not seen yet.
    pub requests: usize,
    /// Whether it takes requests (a replica whose worker could not be restarted, a node that
    /// left or is full does not).
    pub available: bool,
}

/// Why a target was chosen (counted in the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Session,
    Balance,
    Prefix,
    LeastLoaded,
    RoundRobin,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Session => "session",
            Reason::Balance => "balance",
            Reason::Prefix => "prefix",
            Reason::LeastLoaded => "least_loaded",
            Reason::RoundRobin => "round_robin",
        }
    }
}

/// The policy's state: a prefix tree per target and the sessions' targets. `T` names a target
/// (a replica index, a node id).
#[derive(Debug, Clone)]
pub struct Placement<T> {
    config: PlacementConfig,
    trees: HashMap<T, PrefixTree>,
    /// Session id → its target and the tick it was last placed.
    sessions: HashMap<String, (T, u64)>,
    tick: u64,
}

impl<T: Clone + Eq + Hash> Placement<T> {
    pub fn new(config: PlacementConfig) -> Self {
        Self { config, trees: HashMap::new(), sessions: HashMap::new(), tick: 0 }
    }

    /// Chooses among `targets` for a request with `prompt` in `session`, and records the prompt
    /// (and the session) there. `None` when no target is available.
    pub fn place(&mut self, prompt: &[u32], session: Option<&str>, targets: &[(T, Load)]) -> Option<(T, Reason)> {
        let (target, reason) = self.choose(prompt, session, targets)?;
        self.tick += 1;
        let tokens = self.config.tree_tokens;
        self.trees.entry(target.clone()).or_insert_with(|| PrefixTree::new(tokens)).insert(prompt);
        if let Some(s) = session {
            self.sessions.insert(s.to_string(), (target.clone(), self.tick));
            if self.sessions.len() > self.config.max_sessions {
                self.forget_oldest_sessions();
            }
        }
        Some((target, reason))
    }

    fn choose(&self, prompt: &[u32], session: Option<&str>, targets: &[(T, Load)]) -> Option<(T, Reason)> {
        let up: Vec<&(T, Load)> = targets.iter().filter(|(_, l)| l.available).collect();
        if self.config.routing == Routing::RoundRobin {
            let turn = up.get(self.tick as usize % up.len().max(1))?;
            return Some((turn.0.clone(), Reason::RoundRobin));
        }
        if let Some((pinned, _)) = session.and_then(|s| self.sessions.get(s))
            && up.iter().any(|(t, _)| t == pinned)
        {
            return Some((pinned.clone(), Reason::Session));
        }
        let cached = |t: &T| self.trees.get(t).map_or(0, PrefixTree::len);
        let least = up.iter().min_by_key(|(t, l)| (l.requests, cached(t)))?;
        let most = up.iter().map(|(_, l)| l.requests).max().unwrap_or(0);
        let (low, c) = (least.1.requests, &self.config);
        if most - low > c.balance_abs && most as f64 > c.balance_rel * low as f64 {
            return Some((least.0.clone(), Reason::Balance));
        }
        if self.config.routing == Routing::LeastLoaded {
            return Some((least.0.clone(), Reason::LeastLoaded));
        }
        let matched = |t: &T| self.trees.get(t).map_or(0, |tree| tree.match_len(prompt));
        let best = up.iter().max_by_key(|(t, l)| (matched(t), std::cmp::Reverse(l.requests)))?;
        let hit = matched(&best.0);
        if hit > 0 && hit as f64 >= c.cache_threshold * prompt.len() as f64 {
            return Some((best.0.clone(), Reason::Prefix));
        }
        Some((least.0.clone(), Reason::LeastLoaded))
    }

    /// The target a session is pinned to, if any.
    pub fn session_target(&self, session: &str) -> Option<&T> {
        self.sessions.get(session).map(|(t, _)| t)
    }

    /// Forgets a session (deleted, or ended by its target).
    pub fn forget_session(&mut self, session: &str) {
        self.sessions.remove(session);
    }

    /// Forgets a target that left: its tree, and its sessions' pins.
    pub fn remove(&mut self, target: &T) {
        self.trees.remove(target);
        self.sessions.retain(|_, (t, _)| t != target);
    }

    /// Tokens `target`'s tree holds.
    pub fn cached_tokens(&self, target: &T) -> usize {
        self.trees.get(target).map_or(0, PrefixTree::len)
    }

    /// Drops the least recently placed tenth of the sessions.
    fn forget_oldest_sessions(&mut self) {
        let mut ticks: Vec<u64> = self.sessions.values().map(|(_, tick)| *tick).collect();
        let cut = ticks.len() / 10;
        let (_, &mut oldest_kept, _) = ticks.select_nth_unstable(cut);
        self.sessions.retain(|_, (_, tick)| *tick >= oldest_kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(requests: usize) -> Load {
        Load { requests, available: true }
    }

    #[test]
    fn a_session_stays_on_its_target_while_it_is_up() {
        let mut p = Placement::new(PlacementConfig::default());
        let (first, _) = p.place(&[1, 2, 3], Some("s"), &[(0, load(5)), (1, load(0))]).unwrap();
        assert_eq!(first, 1);
        // Even when its target is busier, and with no prefix in common.
        assert_eq!(p.place(&[9, 9], Some("s"), &[(0, load(0)), (1, load(30))]), Some((1, Reason::Session)));
        // A target that went down loses the session's pin.
        let down = Load { requests: 0, available: false };
        let (moved, reason) = p.place(&[9, 9], Some("s"), &[(0, load(3)), (1, down)]).unwrap();
        assert_eq!((moved, reason), (0, Reason::LeastLoaded));
        assert_eq!(p.session_target("s"), Some(&0));
    }

    #[test]
    fn a_shared_prefix_goes_where_it_is_cached_unless_the_load_is_imbalanced() {
        let mut p = Placement::new(PlacementConfig::default());
        let system: Vec<u32> = (0..100).collect();
        let ask = |q: u32| [system.clone(), vec![1000 + q]].concat();
        assert_eq!(p.place(&ask(0), None, &[(0, load(0)), (1, load(0))]), Some((0, Reason::LeastLoaded)));
        // The prefix's target, though a little busier.
        assert_eq!(p.place(&ask(1), None, &[(0, load(3)), (1, load(0))]), Some((0, Reason::Prefix)));
        // Imbalanced: more than 8 apart and more than 1.5×.
        assert_eq!(p.place(&ask(2), None, &[(0, load(12)), (1, load(2))]), Some((1, Reason::Balance)));
        // Now both hold it: the less loaded of the two.
        assert_eq!(p.place(&ask(3), None, &[(0, load(4)), (1, load(1))]), Some((1, Reason::Prefix)));
        // A prompt sharing too little goes to the least loaded.
        let other: Vec<u32> = [&system[..10], &[5000; 40][..]].concat();
        assert_eq!(p.place(&other, None, &[(0, load(2)), (1, load(1))]), Some((1, Reason::LeastLoaded)));
    }

    #[test]
    fn no_available_target_is_no_choice_and_removed_targets_forget_their_sessions() {
        let mut p = Placement::new(PlacementConfig::default());
        let down = Load { requests: 0, available: false };
        assert_eq!(p.place(&[1], None, &[(0, down)]), None);
        assert_eq!(p.place(&[1], Some("a"), &[(7, load(0))]), Some((7, Reason::LeastLoaded)));
        assert_eq!(p.cached_tokens(&7), 1);
        p.remove(&7);
        assert_eq!(p.session_target("a"), None);
        assert_eq!(p.cached_tokens(&7), 0);
    }

    #[test]
    fn sessions_beyond_the_limit_forget_the_least_recent() {
        let config = PlacementConfig { max_sessions: 20, ..PlacementConfig::default() };
        let mut p = Placement::new(config);
        for i in 0..21 {
            p.place(&[i], Some(&format!("s{i}")), &[(0, load(0))]);
        }
        assert!(p.sessions.len() <= 20);
        assert_eq!(p.session_target("s0"), None);
        assert_eq!(p.session_target("s20"), Some(&0));
    }
}
