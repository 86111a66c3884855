//! Which arm of a [`Choice`] serves a request: the first step whose header or cookie condition
//! holds, else a weighted draw (ingress-nginx's canary precedence: header, then cookie, then
//! weight).

use http::HeaderMap;

use crate::route_policy::{Choice, Condition};

/// The arm serving a request: 0 for the route's backend, `k + 1` for `alternatives[k]`.
pub fn arm<B>(choice: &Choice<B>, headers: &HeaderMap) -> usize {
    if let Some(step) = choice.steps.iter().find(|s| holds(&s.when, headers)) {
        return step.arm;
    }
    if choice.alternatives.iter().all(|a| a.weight == 0) {
        return 0;
    }
    weighted(choice, fastrand::u32(..choice.weight_total.max(1)))
}

/// The arm a draw in `0..weight_total` lands on: the alternatives' weights first, in order,
/// then the route's backend.
pub fn weighted<B>(choice: &Choice<B>, draw: u32) -> usize {
    let mut upto = 0u32;
    for (k, alt) in choice.alternatives.iter().enumerate() {
        upto = upto.saturating_add(alt.weight);
        if draw < upto {
            return k + 1;
        }
    }
    0
}

/// Whether a condition holds for a request.
pub fn holds(condition: &Condition, headers: &HeaderMap) -> bool {
    match condition {
        Condition::Header { name, value } => headers
            .get(&**name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| value.matches(v)),
        Condition::Cookie { name, value } => {
            super::cookie(headers, name).is_some_and(|v| value.matches(v))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route_policy::{Alternative, Pinning, Step, ValueMatch, ValueRegex};
    use http::HeaderValue;

    fn exact(v: &str) -> ValueMatch {
        ValueMatch::Exact(v.into())
    }

    /// ingress-nginx's canary: by-header `x-canary` (always/never), by-cookie `c` (always/never),
    /// weight 30 of 100.
    fn canary(weight: u32) -> Choice<&'static str> {
        let header = |v: &str| Condition::Header {
            name: "x-canary".into(),
            value: exact(v),
        };
        let cookie = |v: &str| Condition::Cookie {
            name: "c".into(),
            value: exact(v),
        };
        Choice {
            alternatives: vec![Alternative {
                backend: "canary",
                weight,
                pinning: Pinning::None,
            }],
            steps: vec![
                Step {
                    when: header("always"),
                    arm: 1,
                },
                Step {
                    when: header("never"),
                    arm: 0,
                },
                Step {
                    when: cookie("always"),
                    arm: 1,
                },
                Step {
                    when: cookie("never"),
                    arm: 0,
                },
            ],
            ..Choice::default()
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn header_then_cookie_then_weight() {
        let c = canary(0);
        assert_eq!(arm(&c, &headers(&[("x-canary", "always")])), 1);
        // The header's "never" wins over the cookie's "always".
        assert_eq!(
            arm(
                &c,
                &headers(&[("x-canary", "never"), ("cookie", "c=always")])
            ),
            0
        );
        // Another header value falls through to the cookie.
        assert_eq!(
            arm(
                &c,
                &headers(&[("x-canary", "maybe"), ("cookie", "a=1; c=always")])
            ),
            1
        );
        let all = canary(100);
        assert_eq!(arm(&all, &headers(&[("cookie", "c=never")])), 0);
        assert_eq!(arm(&all, &headers(&[])), 1);
        assert_eq!(arm(&canary(0), &headers(&[])), 0);
    }

    #[test]
    fn weights_cover_the_total_exactly() {
        let c = canary(30);
        let canary_draws = (0..100).filter(|&d| weighted(&c, d) == 1).count();
        assert_eq!(canary_draws, 30);
        assert_eq!(weighted(&c, 29), 1);
        assert_eq!(weighted(&c, 30), 0);
    }

    #[test]
    fn patterns_match_unanchored() {
        let c = Condition::Header {
            name: "x-user".into(),
            value: ValueMatch::Regex(ValueRegex::new("^(alice|bob)$").unwrap()),
        };
        assert!(holds(&c, &headers(&[("x-user", "bob")])));
        assert!(!holds(&c, &headers(&[("x-user", "bobby")])));
        let loose = Condition::Header {
            name: "x-user".into(),
            value: ValueMatch::Regex(ValueRegex::new("ob").unwrap()),
        };
        assert!(holds(&loose, &headers(&[("x-user", "bobby")])));
    }
}
