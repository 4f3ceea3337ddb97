//! User objects (`cudaUserObjectCreate`, `cuUserObjectCreate`): the references the program
//! holds. The driver frees an object when its last reference goes (the program's or a
//! graph's) and runs its destructor, which asks the client to run the program's function.
//! A handle of a freed object must never reach the driver again, whatever a client sends:
//! so a call that takes a user object is passed on only while the program holds a
//! reference to it (then the driver's count is at least as high, and the object lives),
//! and the program's last reference takes the handle out of the session's table. Natively
//! a program may still release a graph's references through a handle it holds none of;
//! here that is refused as a stale handle.

use std::collections::HashMap;

/// What a call does to the references the program holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Create with `count` references.
    Create,
    /// The program takes `count` more.
    Retain,
    /// The program gives `count` up.
    Release,
    /// A graph takes references: the program's `count` move to it (`moved`), or new ones.
    GraphRetain { moved: bool },
    /// A graph's references go (the program must hold one to name the object).
    GraphRelease,
}

/// The user-object function `name` is, with the parameter indices of the object and the
/// count (None: not one).
fn op(name: &str, args: &[u64]) -> Option<(Op, usize, usize)> {
    Some(match name {
        "cudaUserObjectCreate" | "cuUserObjectCreate" => (Op::Create, 0, 3),
        "cudaUserObjectRetain" | "cuUserObjectRetain" => (Op::Retain, 0, 1),
        "cudaUserObjectRelease" | "cuUserObjectRelease" => (Op::Release, 0, 1),
        // cudaGraphUserObjectMove / CU_GRAPH_USER_OBJECT_MOVE is 1.
        "cudaGraphRetainUserObject" | "cuGraphRetainUserObject" => {
            (Op::GraphRetain { moved: args.get(3).is_some_and(|f| f & 1 != 0) }, 1, 2)
        }
        "cudaGraphReleaseUserObject" | "cuGraphReleaseUserObject" => (Op::GraphRelease, 1, 2),
        _ => return None,
    })
}

/// Whether `name` is a user-object call (a cheap test before the lock, on every call).
pub fn involved(name: &str) -> bool {
    name.contains("UserObject")
}

/// The program's references per user object (the driver's handle).
#[derive(Default)]
pub struct References {
    held: HashMap<u64, u64>,
}

impl References {
    /// Before a call (its arguments with handles mapped to the driver's): Err(why) where it
    /// would pass the driver an object the program holds no reference to, or give up more
    /// references than it holds.
    pub fn check(&self, name: &str, raw: &[u64]) -> Result<(), String> {
        let Some((op, object, count)) = op(name, raw) else { return Ok(()) };
        if op == Op::Create {
            return Ok(());
        }
        let (object, count) =
            (raw.get(object).copied().unwrap_or(0), raw.get(count).copied().unwrap_or(0) & 0xffff_ffff);
        let held = self.held.get(&object).copied().unwrap_or(0);
        let needs = match op {
            Op::Release | Op::GraphRetain { moved: true } => count.max(1),
            _ => 1,
        };
        if held < needs {
            return Err(format!(
                "{name}: the program holds {held} reference(s) to this user object, the call needs {needs}"
            ));
        }
        Ok(())
    }

    /// After a successful call: the program's references now. `created`: the driver's
    /// handle a create wrote. Some(object) when the program's last reference went (its
    /// handle leaves the session's table).
    pub fn after(&mut self, name: &str, raw: &[u64], created: Option<u64>) -> Option<u64> {
        let (op, object, count) = op(name, raw)?;
        let count = raw.get(count).copied().unwrap_or(0) & 0xffff_ffff;
        let object = match op {
            Op::Create => created?,
            _ => raw.get(object).copied()?,
        };
        let held = self.held.entry(object).or_default();
        match op {
            Op::Create | Op::Retain => *held = held.saturating_add(count),
            Op::Release | Op::GraphRetain { moved: true } => *held = held.saturating_sub(count),
            Op::GraphRetain { moved: false } | Op::GraphRelease => {}
        }
        if *held > 0 {
            return None;
        }
        self.held.remove(&object);
        Some(object)
    }
}

#[cfg(test)]
mod tests {
    use super::References;

    #[test]
    fn the_programs_last_reference_takes_the_handle_away() {
        let mut r = References::default();
        // Created with 2; one more; three released.
        assert_eq!(r.after("cudaUserObjectCreate", &[0x10, 0, 0, 2, 1], Some(0xa)), None);
        assert!(r.check("cudaUserObjectRetain", &[0xa, 1]).is_ok());
        assert_eq!(r.after("cudaUserObjectRetain", &[0xa, 1], None), None);
        assert!(r.check("cudaUserObjectRelease", &[0xa, 4]).is_err(), "more than it holds");
        assert_eq!(r.after("cuUserObjectRelease", &[0xa, 3], None), Some(0xa));
        // Gone: nothing about it reaches the driver.
        assert!(r.check("cudaUserObjectRetain", &[0xa, 1]).is_err());
        assert!(r.check("cudaGraphReleaseUserObject", &[0x99, 0xa, 1]).is_err());
        assert!(r.check("cudaStreamSynchronize", &[0xa]).is_ok(), "not a user-object call");
    }

    #[test]
    fn a_graph_takes_references_moved_or_new() {
        let mut r = References::default();
        r.after("cuUserObjectCreate", &[0x10, 0, 0, 1, 1], Some(0xb));
        // A new reference for the graph: the program keeps its own.
        assert!(r.check("cudaGraphRetainUserObject", &[0x99, 0xb, 1, 0]).is_ok());
        assert_eq!(r.after("cudaGraphRetainUserObject", &[0x99, 0xb, 1, 0], None), None);
        assert!(r.check("cudaGraphReleaseUserObject", &[0x99, 0xb, 1]).is_ok());
        // Moved: the program's only reference is the graph's now.
        assert!(r.check("cudaGraphRetainUserObject", &[0x99, 0xb, 2, 1]).is_err(), "moves more than it holds");
        assert_eq!(r.after("cuGraphRetainUserObject", &[0x99, 0xb, 1, 1], None), Some(0xb));
    }
}
