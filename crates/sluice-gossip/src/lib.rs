//! The delta shipper: how a region tells the others its counts of busy global keys, and how
//! it hears theirs, with no cross-region call on the hot path.
//!
//! The arithmetic is sans-IO and lives in the core, shared with the simulator:
//! [`sluice_core::ship::LocalUsage`] picks what to send each interval (busy keys only, nearest
//! their limit first, within a byte budget) and [`sluice_core::merge::RemoteCounts`] keeps the
//! max per `(region, key, window)` and sums the other regions' figures for a decision. This
//! crate is the I/O around them:
//!
//! - **Membership** runs on chitchat (cluster id, seed nodes, failure detection): each daemon
//!   publishes its region, and every daemon knows which daemons of which regions are alive and
//!   at which gossip address.
//! - **Counts** go once per `ship_interval`, by default from each region's elected sender to
//!   each other region's receiver, which passes them on in its region (`region_sender`; the
//!   region's daemons send their selections to its sender first), or directly from each
//!   shipping daemon to every live daemon of the *other* regions (`every_daemon`), as versioned protobuf packets ([`wire::CountsPacket`],
//!   front-coded by [`pack`]) in UDP datagrams on the same port. chitchat is not used for
//!   them: it moves one ~64 KB delta per gossip round and peer, so 100k busy keys (≈1 MB a
//!   second even packed) would lag without bound, and its anti-entropy would make every daemon
//!   store every other daemon's values. docs/regions.md has the numbers.
//! - **Security**: every datagram is a frame carrying the cluster id and, with a shared key,
//!   an HMAC-SHA256 tag ([`wire`]); foreign, forged and malformed datagrams are dropped and
//!   counted, never fatal.
//!
//! What a daemon holds is bounded by regions × busy keys (the remote table has a key bound),
//! never by the number of daemons elsewhere: every daemon of a region reads the same store, so
//! each ships the same region-level figure and receivers keep the max.
//!
//! # Layout
//!
//! - [`wire`]: frames, HMAC, the protobuf messages.
//! - `keyring`: the shared keys, two during a rotation, replaced without a restart.
//! - [`pack`]: a selection to datagram-sized packets and back.
//! - [`metrics`]: counters for `/metrics`.
//! - [`node`]: the running node ([`Node`]): socket, chitchat, ship and receive tasks.
//! - `relay`: where a daemon's datagrams go in each `shippers` mode (for `region_sender`, one
//!   sender per region, the core's election as addresses), and the figures a region's sender
//!   gathers from its daemons.
//! - `forward`: forwarding between region senders (`fanout`): other origins' figures passed
//!   on to peer regions along the core's trees.
//! - [`wire_check`]: the property the fuzz target and the regression replay hold the decoder
//!   to.
//! - `transport`: chitchat's transport over the shared, framed socket.

mod forward;
mod keyring;
pub mod metrics;
pub mod node;
pub mod pack;
mod relay;
mod transport;
pub mod wire;
pub mod wire_check;

pub use metrics::{Gauges, GossipMetrics, Scope};
pub use node::{Config, GossipError, Member, Node, RuleLookup, Shippers, now_micros};
pub use wire::{FrameCodec, Kind, Reject};
