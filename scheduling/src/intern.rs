//! Interned label keys and values: the solver compares small integers instead of strings, and
//! requirement sets are sorted integer vectors.
//!
//! Owns the string ↔ id tables and the integer reading of values (for `Gt`/`Lt`). Must not hold any
//! scheduling meaning.

use std::collections::HashMap;

/// An interned label key.
pub type Key = u32;
/// An interned label value.
pub type Val = u32;

/// String tables of one solve. Ids are assigned in first-seen order, so they are deterministic for a
/// given input.
#[derive(Debug, Default, Clone)]
pub struct Interner {
    key_ids: HashMap<String, Key>,
    keys: Vec<String>,
    val_ids: HashMap<String, Val>,
    vals: Vec<String>,
    ints: Vec<Option<i64>>,
}

impl Interner {
    /// Id of a key, added if new.
    pub fn key(&mut self, s: &str) -> Key {
        if let Some(&id) = self.key_ids.get(s) {
            return id;
        }
        let id = u32::try_from(self.keys.len()).unwrap_or(u32::MAX);
        self.keys.push(s.to_string());
        self.key_ids.insert(s.to_string(), id);
        id
    }

    /// Id of a value, added if new.
    pub fn val(&mut self, s: &str) -> Val {
        if let Some(&id) = self.val_ids.get(s) {
            return id;
        }
        let id = u32::try_from(self.vals.len()).unwrap_or(u32::MAX);
        self.vals.push(s.to_string());
        self.ints.push(s.parse::<i64>().ok());
        self.val_ids.insert(s.to_string(), id);
        id
    }

    /// Id of a key already seen.
    pub fn lookup_key(&self, s: &str) -> Option<Key> {
        self.key_ids.get(s).copied()
    }

    /// Id of a value already seen.
    pub fn lookup_val(&self, s: &str) -> Option<Val> {
        self.val_ids.get(s).copied()
    }

    /// The key's text.
    pub fn key_name(&self, k: Key) -> &str {
        self.keys.get(k as usize).map_or("", String::as_str)
    }

    /// The value's text.
    pub fn val_name(&self, v: Val) -> &str {
        self.vals.get(v as usize).map_or("", String::as_str)
    }

    /// The value as an integer, when it is one.
    pub fn int(&self, v: Val) -> Option<i64> {
        self.ints.get(v as usize).copied().flatten()
    }

    /// All known keys (for "did you mean" hints).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }
}
