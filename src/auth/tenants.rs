//! Which models a tenant may call: allow lists of globs (`ranker*`, `add_sub`, `*`).

/// A list of model globs; a model is allowed when any matches. `*` matches any run of
/// characters, `?` one character; everything else matches itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelAccess {
    globs: Vec<String>,
}

impl ModelAccess {
    /// An allow list from globs.
    pub fn new<S: AsRef<str>>(globs: impl IntoIterator<Item = S>) -> Self {
        Self {
            globs: globs.into_iter().map(|g| g.as_ref().to_owned()).collect(),
        }
    }

    /// Whether `model` is allowed.
    pub fn allows(&self, model: &str) -> bool {
        self.globs.iter().any(|glob| glob_match(glob, model))
    }
}

/// Matches `text` against `glob` (`*` and `?`), iteratively: linear in practice, no
/// recursion for hostile names.
pub fn glob_match(glob: &str, text: &str) -> bool {
    let (glob, text) = (glob.as_bytes(), text.as_bytes());
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if g < glob.len() && (glob[g] == b'?' || glob[g] == text[t]) {
            g += 1;
            t += 1;
        } else if g < glob.len() && glob[g] == b'*' {
            star = Some((g, t));
            g += 1;
        } else if let Some((sg, st)) = star {
            g = sg + 1;
            t = st + 1;
            star = Some((sg, st + 1));
        } else {
            return false;
        }
    }
    glob[g..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_shell_patterns() {
        assert!(glob_match("ranker*", "ranker"));
        assert!(glob_match("ranker*", "ranker_b"));
        assert!(!glob_match("ranker*", "xranker"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("*_v*", "model_v2"));
        assert!(!glob_match("add_sub", "add_sub_int"));
        assert!(glob_match("*a*a*a*b", "aaaaaaaaaaaaaaaaaaab"));
        assert!(!glob_match("*a*a*a*b", "aaaaaaaaaaaaaaaaaaaa"));
        let access = ModelAccess::new(["ranker*", "add_sub"]);
        assert!(access.allows("ranker_a") && access.allows("add_sub"));
        assert!(!access.allows("secret"));
        assert!(!ModelAccess::default().allows("anything"));
    }
}
