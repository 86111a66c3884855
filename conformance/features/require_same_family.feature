@dual-stack
Feature: RequireSameFamily
  With the annotation `duet.dev/upstream-family: RequireSameFamily` an Ingress never crosses
  families: a client reaches only pods that have an address of its own family, over that address.

  Scenario: Requests never cross families
    Given a new random namespace
    Given a Service "strict" with these pods:
      | pod           | ipv4   | ipv6   |
      | strict-dual   | listen | listen |
      | strict-v4only | listen | absent |
      | strict-v6only | absent | listen |
    Given an Ingress resource
    """
    apiVersion: networking.k8s.io/v1
    kind: Ingress
    metadata:
      name: require-same-family
      annotations:
        duet.dev/upstream-family: RequireSameFamily
    spec:
      rules:
      - host: require-same-family
        http:
          paths:
          - path: /
            pathType: Prefix
            backend:
              service:
                name: strict
                port:
                  number: 8080
    """
    Then The Ingress status shows the IP address or FQDN where it is exposed
    When I send 200 requests to "http://require-same-family"
    Then every response status-code must be 200
    And every request must reach a pod over the client's address family
    And only the pods with an address of the client's family must serve requests
