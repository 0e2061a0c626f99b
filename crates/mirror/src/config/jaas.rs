//! JAAS lines (`sasl.jaas.config`) as Java reads them: the login module, its control flag and its
//! options. Errors never echo option values (they may be passwords).

/// The value of JAAS option `name`; a repeated option: the last one counts, as in Java.
pub(crate) fn jaas_option(options: &[(String, String)], name: &str) -> Option<String> {
    options
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// The login module of a JAAS line and its options, in order. Errors never contain option
/// values (they may be passwords).
pub(crate) fn jaas_options(text: &str) -> Result<(String, Vec<(String, String)>), String> {
    let mut tokens = JaasTokens {
        chars: text.trim().chars().collect(),
        pos: 0,
    };
    let module = tokens.word().ok_or("no login module")?;
    let flag = tokens
        .word()
        .ok_or("no control flag after the login module")?;
    if !["required", "requisite", "sufficient", "optional"]
        .contains(&flag.to_ascii_lowercase().as_str())
    {
        return Err("the control flag must be required, requisite, sufficient or optional".into());
    }
    let mut options = Vec::new();
    loop {
        tokens.skip_ws();
        match tokens.peek() {
            Some(';') => {
                tokens.pos += 1;
                break;
            }
            None => return Err("missing ';' at the end".into()),
            _ => {}
        }
        let name = tokens.word().ok_or("expected option=value")?;
        tokens.skip_ws();
        if tokens.peek() != Some('=') {
            // Never echo the token: after a broken quote it may be part of the password.
            return Err("an option has no '=value'".into());
        }
        tokens.pos += 1;
        let value = tokens
            .value()
            .ok_or("an option has an unterminated or missing value")?;
        options.push((name, value));
    }
    tokens.skip_ws();
    if tokens.peek().is_some() {
        return Err("more than one login module; kmirror uses exactly one".into());
    }
    Ok((module, options))
}

struct JaasTokens {
    chars: Vec<char>,
    pos: usize,
}

impl JaasTokens {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    /// A bare word: a module class name, a flag or an option name.
    fn word(&mut self) -> Option<String> {
        self.skip_ws();
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '$'))
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.chars[start..self.pos].iter().collect())
    }

    /// A quoted string (with `\"` and `\\` escapes) or a bare word.
    fn value(&mut self) -> Option<String> {
        self.skip_ws();
        if self.peek() != Some('"') {
            return self.word();
        }
        self.pos += 1;
        let mut out = String::new();
        loop {
            match self.peek()? {
                '"' => {
                    self.pos += 1;
                    return Some(out);
                }
                '\\' => {
                    self.pos += 1;
                    out.push(self.peek()?);
                    self.pos += 1;
                }
                c => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }
}
