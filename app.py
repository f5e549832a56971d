#!/usr/bin/env python3
"""The CDK app: every example stack, with the cdk-nag AwsSolutions, NIST 800-53 R5 and HIPAA Security packs on.

npx cdk synth                       # templates for AWS (default synthesizer)
npx cdk deploy -c local=true ...    # bootstrap-free synthesizer, for the local emulator (make deploy-local)
"""

from aws_cdk import App

from examples import build_app

app = App()
build_app(app)
app.synth()
